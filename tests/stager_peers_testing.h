// Shared set-up of the stager-to-stager tests (stager_fetch_members_test.cc,
// stager_peers_test.cc): a small tutti.v1.Packer fixture serving
// precomputed plans, a job's dataset and stager options on loopback, and
// FetchMembers as another node's stager calls it.
#ifndef TUTTI_TESTS_STAGER_PEERS_TESTING_H_
#define TUTTI_TESTS_STAGER_PEERS_TESTING_H_

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"
#include "common/http_client.h"
#include "common/rpc_security.h"
#include "gtest/gtest.h"
#include "services/stager/stager_server.h"
#include "services/stager/test_dataset.h"
#include "tutti/v1/packer.grpc.pb.h"
#include "tutti/v1/stager.grpc.pb.h"

namespace tutti::stager::peers_testing {

namespace fs = std::filesystem;

// GetJob, and StreamPlans of testing::MakePlan passed through `edit` (which
// marks items remote_load and names their holder).
class FixturePacker final : public v1::Packer::Service {
 public:
  using Edit = std::function<void(v1::StepPlan*)>;
  FixturePacker(testing::Dataset data, v1::JobInfo job, uint64_t end_step, Edit edit = {})
      : data_(std::move(data)), job_(std::move(job)), end_(end_step), edit_(std::move(edit)) {}
  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest*,
                      v1::JobInfo* out) override {
    while (hold_job_ && !job_released_.WaitForNotificationWithTimeout(absl::Milliseconds(5))) {
      if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
    }
    *out = job_;
    return grpc::Status::OK;
  }
  grpc::Status StreamPlans(grpc::ServerContext* ctx, const v1::StreamPlansRequest* req,
                           grpc::ServerWriter<v1::StepPlan>* w) override {
    while (!open_.WaitForNotificationWithTimeout(absl::Milliseconds(5))) {
      if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
    }
    std::vector<uint32_t> ranks(req->ranks().begin(), req->ranks().end());
    const uint64_t stop = req->end_step() == 0 ? ~uint64_t{0} : req->end_step();
    for (uint64_t s = req->start_step(); s < stop && !ctx->IsCancelled(); ++s) {
      if (s >= end_) {
        return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                            "step " + std::to_string(s) + " is past the end of the dataset");
      }
      if (!w->Write(Plan(s, ranks))) break;
    }
    return grpc::Status::OK;
  }
  // Plans flow once every stager has started (a real cluster's stagers start
  // at different times: a holder not serving yet, or starting past the peer
  // timeout, has its members read from the source, which would make the
  // counts below vary).
  void Open() {
    if (!open_.HasBeenNotified()) open_.Notify();
  }
  // GetJob answers only once ReleaseJob is called (a stager stays starting).
  void HoldJob() { hold_job_ = true; }
  void ReleaseJob() {
    if (!job_released_.HasBeenNotified()) job_released_.Notify();
  }
  v1::StepPlan Plan(uint64_t step, const std::vector<uint32_t>& ranks) const {
    v1::StepPlan plan = testing::MakePlan(data_, job_, step, ranks, 2);
    if (edit_) edit_(&plan);
    return plan;
  }

 private:
  testing::Dataset data_;
  v1::JobInfo job_;
  uint64_t end_;
  Edit edit_;
  absl::Notification open_;
  std::atomic<bool> hold_job_{false};
  absl::Notification job_released_;
};

struct Env {
  std::string root;
  testing::Dataset data;
  v1::JobInfo job;
  std::unique_ptr<FixturePacker> packer;
  std::unique_ptr<GrpcServer> packer_server;
  int packer_port = 0;

  Env(const std::string& name, int shards, uint32_t world, uint32_t ranks_per_node) {
    root = ::testing::TempDir() + "/peers_" + name + "_" + std::to_string(::getpid());
    fs::remove_all(root);
    data = testing::WriteDataset(root + "/src", {.shards = shards, .samples_per_shard = 8});
    job = testing::MakeJob(data, world, ranks_per_node);
    job.mutable_config()->set_job_id("peers-" + name);
  }
  // Plans flow once Open() is called (at once unless `gated`).
  void StartPacker(uint64_t end_step, FixturePacker::Edit edit = {}, bool gated = false) {
    packer = std::make_unique<FixturePacker>(data, job, end_step, std::move(edit));
    if (!gated) packer->Open();
    auto s = StartGrpcServer("127.0.0.1:0", {packer.get()}, &packer_port);
    ASSERT_TRUE(s.ok()) << s.status();
    packer_server = std::move(*s);
  }
  StagerServerOptions Options(uint32_t node) {
    StagerServerOptions o;
    o.packer = "127.0.0.1:" + std::to_string(packer_port);
    o.listen = "127.0.0.1:0";
    o.metrics = "127.0.0.1:0";
    o.packer_wait = absl::Seconds(20);
    o.core.node = node;
    o.core.cache_dir = absl::StrCat(root, "/cache", node);
    o.core.staging.source_dir = data.dir;
    o.core.staging.queue_depth = 8;
    o.core.staging.block_size = 65536;
    o.core.decode_threads = 2;
    o.core.window = 2;
    o.core.stage_ahead = 2;
    return o;
  }
  ~Env() { fs::remove_all(root); }
};

// The bytes of `member` as stored in the shard.
inline std::string MemberBytes(const testing::Dataset& data, const v1::ShardRef& shard,
                               const v1::MemberRef& member) {
  std::ifstream in(data.dir + "/" + shard.name(), std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return all.substr(member.offset(), member.size());
}

// FetchMembers for `req` with `security`'s token: the stream's messages by
// index, and how it ended.
struct Fetched {
  grpc::Status status;
  std::map<uint32_t, v1::FetchedMember> members;
};
inline Fetched Fetch(int port, const v1::FetchMembersRequest& req,
                     const SecurityOptions& security) {
  auto stub = v1::Stager::NewStub(MakeSecureChannel("127.0.0.1:" + std::to_string(port), security));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto reader = stub->FetchMembers(&ctx, req);
  Fetched out;
  v1::FetchedMember m;
  while (reader->Read(&m)) out.members[m.index()] = m;
  out.status = reader->Finish();
  return out;
}

inline double Metric(int port, const std::string& name) {
  absl::StatusOr<std::string> page = HttpGet(port, "/metrics");
  if (!page.ok()) return -1;
  return MetricValue(*page, name).value_or(-1);
}

// A request for the first `n` members (image, text) of shard 0's samples.
inline v1::FetchMembersRequest FirstMembers(const testing::Dataset& data, int n) {
  v1::FetchMembersRequest req;
  *req.mutable_shard() = data.shards[0];
  for (const v1::SampleInfo& s : data.samples) {
    if (s.shard() != 0) continue;
    if (req.members_size() < n) *req.add_members() = s.images(0);
    if (req.members_size() < n) *req.add_members() = s.text();
  }
  return req;
}

// The shards a stager staged.
inline std::set<std::string> Staged(StagerServer& server) {
  std::set<std::string> out;
  const v1::StageStatus status = server.core()->GetStageStatus();
  for (const v1::ShardStatus& s : status.shards()) {
    if (s.state() == v1::ShardStatus::STATE_STAGED) out.insert(s.name());
  }
  return out;
}

}  // namespace tutti::stager::peers_testing

#endif  // TUTTI_TESTS_STAGER_PEERS_TESTING_H_
