// A stager's node reports with locality (services/stager/node_reporter.h):
// a real tutti-stagerd server (StagerServer, in process) against a small
// tutti.v1.Packer fixture that serves plans and keeps the reports. A cache
// too small for the shards its plans name is reported with its capacity,
// the bytes held and the shards refused for want of space, named. A packer
// that does not act on reports (FAILED_PRECONDITION) is logged once, not
// per report.
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "gtest/gtest.h"
#include "services/stager/stager_server.h"
#include "services/stager/test_dataset.h"
#include "tutti/v1/packer.grpc.pb.h"

namespace tutti::stager {
namespace {

namespace fs = std::filesystem;

class ReportingPacker final : public v1::Packer::Service {
 public:
  ReportingPacker(testing::Dataset data, v1::JobInfo job)
      : data_(std::move(data)), job_(std::move(job)) {}
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::JobInfo* out) override {
    *out = job_;
    return grpc::Status::OK;
  }
  grpc::Status StreamPlans(grpc::ServerContext* ctx, const v1::StreamPlansRequest* req,
                           grpc::ServerWriter<v1::StepPlan>* w) override {
    std::vector<uint32_t> ranks(req->ranks().begin(), req->ranks().end());
    const uint64_t stop = req->end_step() == 0 ? 4 : std::min<uint64_t>(req->end_step(), 4);
    for (uint64_t s = req->start_step(); s < stop && !ctx->IsCancelled(); ++s) {
      if (!w->Write(testing::MakePlan(data_, job_, s, ranks, 2))) break;
    }
    return grpc::Status::OK;
  }
  grpc::Status ReportNode(grpc::ServerContext*, const v1::NodeReport* r,
                          v1::NodeReportResponse*) override {
    absl::MutexLock l(&mu_);
    reports_.push_back(*r);
    return answer_;
  }
  void set_answer(grpc::Status answer) {
    absl::MutexLock l(&mu_);
    answer_ = std::move(answer);
  }
  std::vector<v1::NodeReport> reports() {
    absl::MutexLock l(&mu_);
    return reports_;
  }

 private:
  testing::Dataset data_;
  v1::JobInfo job_;
  absl::Mutex mu_;
  std::vector<v1::NodeReport> reports_ ABSL_GUARDED_BY(mu_);
  grpc::Status answer_ ABSL_GUARDED_BY(mu_);
};

// How often `needle` occurs in `text`.
int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

// A stager of node `node` over `data` whose packer listens on `port`,
// reporting its node every `interval`.
StagerServerOptions ReportingStager(const std::string& root, const testing::Dataset& data, int port,
                                    uint32_t node, absl::Duration interval) {
  StagerServerOptions o;
  o.packer = "127.0.0.1:" + std::to_string(port);
  o.listen = "127.0.0.1:0";
  o.metrics = "127.0.0.1:0";
  o.packer_wait = absl::Seconds(20);
  o.core.node = node;
  o.core.cache_dir = root + "/cache";
  o.core.staging.source_dir = data.dir;
  o.core.window = 2;
  o.core.stage_ahead = 2;
  o.node_report_interval = interval;
  return o;
}

TEST(NodeReportTest, AFullCacheIsReportedWithItsCapacityAndTheShardsItRefused) {
  const std::string root = ::testing::TempDir() + "/node_report_" + std::to_string(::getpid());
  fs::remove_all(root);
  testing::Dataset data =
      testing::WriteDataset(root + "/src", {.shards = 4, .samples_per_shard = 8});
  v1::JobInfo job = testing::MakeJob(data, /*world=*/4, /*ranks_per_node=*/2);
  job.mutable_config()->set_job_id("node-report");
  job.mutable_config()->mutable_locality()->set_home_replication(1);
  uint64_t smallest = UINT64_MAX;
  for (const v1::ShardRef& s : data.shards) smallest = std::min<uint64_t>(smallest, s.size());
  ReportingPacker packer(data, job);
  int port = 0;
  auto grpc_server = StartGrpcServer("127.0.0.1:0", {&packer}, &port);
  ASSERT_TRUE(grpc_server.ok()) << grpc_server.status();

  StagerServerOptions o = ReportingStager(root, data, port, /*node=*/1, absl::Milliseconds(100));
  o.core.cache_capacity_bytes = smallest / 2;  // no shard fits
  StagerServer server(o);
  ASSERT_TRUE(server.Start().ok());

  v1::NodeReport last;
  for (int i = 0; i < 200; ++i) {
    std::vector<v1::NodeReport> got = packer.reports();
    if (!got.empty()) last = got.back();
    if (last.refused_shards() > 0) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(last.node(), 1u);
  EXPECT_EQ(last.config_fingerprint(), job.config_fingerprint());
  EXPECT_EQ(last.cache_capacity_bytes(), smallest / 2);
  EXPECT_EQ(last.cache_held_bytes(), 0u);
  EXPECT_GT(last.refused_shards(), 0u);
  ASSERT_GT(last.refused_shard_names_size(), 0);
  bool known = false;
  for (const v1::ShardRef& s : data.shards) known |= s.name() == last.refused_shard_names(0);
  EXPECT_TRUE(known) << last.refused_shard_names(0);
  server.Shutdown();
  fs::remove_all(root);
}

TEST(NodeReportTest, APackerThatDoesNotActOnReportsIsLoggedOnceNotPerReport) {
  const std::string root = ::testing::TempDir() + "/node_report_np_" + std::to_string(::getpid());
  fs::remove_all(root);
  testing::Dataset data =
      testing::WriteDataset(root + "/src", {.shards = 2, .samples_per_shard = 8});
  v1::JobInfo job = testing::MakeJob(data, /*world=*/4, /*ranks_per_node=*/2);
  job.mutable_config()->set_job_id("node-report-unacted");
  job.mutable_config()->mutable_locality()->set_home_replication(1);
  ReportingPacker packer(data, job);
  // What tutti-packerd answers without --locality_record.
  packer.set_answer(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                 "tutti-packerd does not act on node reports"));
  int port = 0;
  auto grpc_server = StartGrpcServer("127.0.0.1:0", {&packer}, &port);
  ASSERT_TRUE(grpc_server.ok()) << grpc_server.status();

  StagerServerOptions o = ReportingStager(root, data, port, /*node=*/0, absl::Milliseconds(20));
  const std::string said = "the packer does not act on this node's reports";
  ::testing::internal::CaptureStderr();
  StagerServer server(o);
  const absl::Status started = server.Start();
  for (int i = 0; i < 400 && packer.reports().size() < 8; ++i) {
    absl::SleepFor(absl::Milliseconds(25));
  }
  const size_t refused = packer.reports().size();
  // The packer takes reports again (restarted with a record), then not.
  packer.set_answer(grpc::Status::OK);
  for (int i = 0; i < 400 && packer.reports().size() < refused + 4; ++i) {
    absl::SleepFor(absl::Milliseconds(25));
  }
  const size_t taken = packer.reports().size();
  packer.set_answer(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no record"));
  for (int i = 0; i < 400 && packer.reports().size() < taken + 8; ++i) {
    absl::SleepFor(absl::Milliseconds(25));
  }
  const size_t total = packer.reports().size();
  server.Shutdown();
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_GE(refused, 8u) << log;
  ASSERT_GE(taken, refused + 4) << log;
  ASSERT_GE(total, taken + 8) << log;
  // Once per stretch of refused reports: twice in all, and "again" between.
  EXPECT_EQ(Count(log, said), 2) << log;
  EXPECT_EQ(Count(log, "--locality_record FILE"), 2) << log;
  EXPECT_EQ(Count(log, "the packer acts on this node's reports again"), 1) << log;
  EXPECT_EQ(Count(log, "node report to the packer failed"), 0) << log;
  fs::remove_all(root);
}

}  // namespace
}  // namespace tutti::stager
