#include "services/stager/node_reporter.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "services/stager/staging/cache.h"
#include "services/stager/staging/staging.h"

namespace tutti::stager {
namespace {

const Logger kLog("stager.node");

// What ReportNode accepts (services/packer/locality_monitor.h).
constexpr int kMaxNames = 16;
constexpr size_t kMaxName = 1024;

}  // namespace

NodeReporter::NodeReporter(std::shared_ptr<grpc::Channel> channel, StagerCore* core,
                           StagerMetrics* metrics, NodeReporterOptions options)
    : stub_(v1::Packer::NewStub(std::move(channel))),
      core_(core),
      metrics_(metrics),
      options_(options) {}

NodeReporter::~NodeReporter() { Stop(); }

std::optional<v1::NodeReport> NodeReporter::Build() const {
  const std::vector<uint32_t> ranks = core_->local_ranks();
  if (ranks.empty()) return std::nullopt;
  const v1::JobInfo& job = core_->job();
  v1::NodeReport r;
  r.set_node(ranks.front() / std::max<uint32_t>(job.config().ranks_per_node(), 1));
  r.set_config_fingerprint(job.config_fingerprint());
  if (ShardCache* cache = core_->cache(); cache != nullptr) {
    r.set_cache_capacity_bytes(cache->capacity());
    r.set_cache_held_bytes(cache->cached_bytes());
  }
  if (StagingEngine* staging = core_->staging(); staging != nullptr) {
    uint32_t refused = 0;
    for (const ShardStatusInfo& s : staging->Snapshot()) {
      if (s.state != ShardState::kFailed || !absl::IsResourceExhausted(s.error)) continue;
      ++refused;
      if (r.refused_shard_names_size() < kMaxNames && s.name.size() <= kMaxName) {
        r.add_refused_shard_names(s.name);
      }
    }
    r.set_refused_shards(refused);
  }
  return r;
}

absl::Status NodeReporter::SendOnce() {
  std::optional<v1::NodeReport> r = Build();
  if (!r) return absl::OkStatus();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  v1::NodeReportResponse resp;
  const grpc::Status s = stub_->ReportNode(&ctx, *r, &resp);
  if (s.ok()) {
    if (metrics_) metrics_->node_reports_sent.Increment();
    return absl::OkStatus();
  }
  if (metrics_) metrics_->node_reports_failed.Increment();
  return FromGrpcStatus(s, absl::StrCat("ReportNode of node ", r->node()));
}

void NodeReporter::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] {
    do {
      absl::Status s = SendOnce();
      if (absl::IsFailedPrecondition(s)) {
        // A packer that does not act on reports answers every one alike:
        // said once (until it takes one), not per report.
        if (!told_not_acted_on_) {
          told_not_acted_on_ = true;
          kLog.Warning(
              "the packer does not act on this node's reports (it runs without "
              "--locality_record, or its job has no locality): a dead node's shards are not "
              "re-homed and a full cache is not re-homed within its capacity; start "
              "tutti-packerd with --locality_record FILE on storage that outlives it. Reports "
              "go on; this is logged once",
              {{"error", s.message()}});
        }
      } else if (uint64_t suppressed = 0; !s.ok() && limit_.Allow(&suppressed)) {
        kLog.Warning("node report to the packer failed; the next is sent on time",
                     {{"error", s.message()}, {"suppressed", suppressed}});
      } else if (s.ok() && told_not_acted_on_) {
        told_not_acted_on_ = false;
        kLog.Info("the packer acts on this node's reports again");
      }
    } while (!stop_.WaitForNotificationWithTimeout(options_.interval));
  });
}

void NodeReporter::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tutti::stager
