#include "services/packer/locality_monitor.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/byte_size.h"
#include "common/log.h"

namespace tutti::packer {
namespace {

const Logger kLog("packer");

uint32_t NodesOf(const Job& job) {
  return job.world_size() / std::max<uint32_t>(job.ranks_per_node(), 1);
}

}  // namespace

LocalityMonitor::LocalityMonitor(std::shared_ptr<const Job> job, LocalitySchedule* schedule,
                                 PackerMetrics* metrics, LocalityMonitorOptions options)
    : job_(std::move(job)),
      schedule_(schedule),
      metrics_(metrics),
      options_(std::move(options)),
      liveness_(NodesOf(*job_), options_.liveness, options_.operator_removed) {
  if (metrics_ != nullptr) {
    // Every reason's series from the start (0 until it happens).
    for (const char* reason : {"dead", "returned", "capacity"}) {
      metrics_->locality_rehomings_family.Add({{"reason", reason}});
      metrics_->locality_rehomings_refused_family.Add({{"reason", reason}});
    }
  }
  absl::MutexLock lock(&mu_);
  SetMetrics(options_.clock());
}

LocalityMonitor::~LocalityMonitor() { Stop(); }

void LocalityMonitor::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(options_.tick)) Tick();
  });
}

void LocalityMonitor::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

absl::Status LocalityMonitor::Report(const v1::NodeReport& r) {
  const uint32_t nodes = NodesOf(*job_);
  absl::Status s;
  if (r.node() >= nodes) {
    s = absl::InvalidArgumentError(absl::StrCat(
        "node report for node ", r.node(), ", which the job does not have (nodes 0..", nodes - 1,
        " of world_size ", job_->world_size(), " / ranks_per_node ", job_->ranks_per_node(),
        "); start the stager with its node's --node (rank / ranks_per_node)"));
  } else if (r.config_fingerprint() != job_->fingerprint()) {
    s = absl::FailedPreconditionError(
        absl::StrCat("node report of node ", r.node(), ": config_fingerprint '",
                     r.config_fingerprint(), "' is not this job's (", job_->fingerprint(),
                     "): the stager serves another job; point it at its own packer"));
  } else if (r.refused_shard_names_size() > kMaxReportedShardNames) {
    s = absl::InvalidArgumentError(absl::StrCat(
        "node report of node ", r.node(), " names ", r.refused_shard_names_size(),
        " refused shards, more than ", kMaxReportedShardNames, "; send the count and a few names"));
  } else {
    for (const std::string& name : r.refused_shard_names()) {
      if (name.size() > kMaxReportedShardName) {
        s = absl::InvalidArgumentError(absl::StrCat("node report of node ", r.node(),
                                                    ": a refused shard name of ", name.size(),
                                                    " bytes, more than ", kMaxReportedShardName));
        break;
      }
    }
  }
  if (!s.ok()) {
    if (metrics_) metrics_->locality_reports_rejected.Increment();
    return s;
  }
  if (metrics_) metrics_->locality_reports_accepted.Increment();
  NodeReport n;
  n.node = r.node();
  n.capacity_bytes = r.cache_capacity_bytes();
  n.held_bytes = r.cache_held_bytes();
  n.refused_shards = r.refused_shards();
  if (n.refused_shards > 0) {
    kLog.Warning(absl::StrCat(
        "node ", n.node, " could not stage ", n.refused_shards, " shards for want of space (",
        absl::StrJoin(r.refused_shard_names(), ", "), "); it holds ", FormatBytes(n.held_bytes),
        " of ", n.capacity_bytes ? FormatBytes(n.capacity_bytes) : "unbounded"));
  }
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock();
  liveness_.Report(n, now);
  Act(now);
  return absl::OkStatus();
}

void LocalityMonitor::Tick() {
  absl::MutexLock lock(&mu_);
  Act(options_.clock());
}

void LocalityMonitor::Act(absl::Time now) {
  std::vector<ProposedChange> due = liveness_.Due(now, *schedule_->homes());
  // Removals and additions first, in one announcement; then each capacity
  // on its own, so one that cannot fit does not hold back the others.
  std::vector<std::vector<ProposedChange>> groups;
  for (const ProposedChange& p : due) {
    if (p.change.kind != LocalityChange::Kind::kCapacity) {
      if (groups.empty()) groups.emplace_back();
      groups.front().push_back(p);
    }
  }
  for (const ProposedChange& p : due) {
    if (p.change.kind == LocalityChange::Kind::kCapacity) groups.push_back({p});
  }
  for (const std::vector<ProposedChange>& group : groups) {
    std::vector<LocalityChange> changes;
    std::string what;
    for (const ProposedChange& p : group) {
      changes.push_back(p.change);
      absl::StrAppend(&what, what.empty() ? "" : ", ", "node ", p.change.node, " ", p.reason);
      if (p.change.kind == LocalityChange::Kind::kCapacity) {
        absl::StrAppend(&what, " (holds at most ", FormatBytes(p.change.capacity_bytes),
                        ", the homes assigned ",
                        FormatBytes(schedule_->homes()
                                        ->HomesAt(std::numeric_limits<uint64_t>::max())
                                        .BytesOf(p.change.node)),
                        ")");
      }
    }
    absl::StatusOr<uint64_t> from = schedule_->Announce(changes);
    if (!from.ok()) {
      kLog.Error(absl::StrCat("shard homes not changed for ", what, ": ", from.status().message(),
                              "; plans go on with the homes in force (what a node cannot stage "
                              "is read from the source)"));
      for (const ProposedChange& p : group) {
        liveness_.Refused(p.change);
        if (metrics_) {
          metrics_->locality_rehomings_refused_family.Add({{"reason", p.reason}}).Increment();
        }
      }
      continue;
    }
    kLog.Warning(absl::StrCat("shard homes change from step ", *from, ": ", what,
                              "; steps before it keep their homes"));
    if (metrics_) {
      metrics_->locality_change_from_step.Set(static_cast<double>(*from));
      for (const ProposedChange& p : group) {
        metrics_->locality_rehomings_family.Add({{"reason", p.reason}}).Increment();
      }
    }
  }
  SetMetrics(now);
}

void LocalityMonitor::SetMetrics(absl::Time now) {
  if (metrics_ == nullptr) return;
  constexpr uint64_t kLatest = std::numeric_limits<uint64_t>::max();
  const std::shared_ptr<const HomeStaging> homes = schedule_->homes();
  const std::vector<uint32_t>& excluded = homes->ExcludedAt(kLatest);
  uint32_t live = 0, removed = 0, silent = 0, unreported = 0;
  for (uint32_t node = 0; node < homes->nodes(); ++node) {
    const std::string id = absl::StrCat(node);
    if (std::binary_search(excluded.begin(), excluded.end(), node)) {
      ++removed;
    } else if (!liveness_.reported(node)) {
      ++unreported;
    } else if (liveness_.silent(node, now)) {
      ++silent;
    } else {
      ++live;
    }
    auto& f = metrics_->locality_node_cache_bytes;
    f.Add({{"node", id}, {"kind", "assigned"}})
        .Set(static_cast<double>(homes->HomesAt(kLatest).BytesOf(node)));
    if (liveness_.reported(node)) {
      f.Add({{"node", id}, {"kind", "capacity"}})
          .Set(static_cast<double>(liveness_.last(node).capacity_bytes));
      f.Add({{"node", id}, {"kind", "held"}})
          .Set(static_cast<double>(liveness_.last(node).held_bytes));
    }
  }
  auto& n = metrics_->locality_nodes_family;
  n.Add({{"state", "live"}}).Set(live);
  n.Add({{"state", "removed"}}).Set(removed);
  n.Add({{"state", "silent"}}).Set(silent);
  n.Add({{"state", "unreported"}}).Set(unreported);
}

}  // namespace tutti::packer
