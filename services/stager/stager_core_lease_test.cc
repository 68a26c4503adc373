// StagerCore's lease renewals (the lease logic itself: batch_window_test.cc).
#include <prometheus/registry.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "services/stager/stager_core.h"
#include "services/stager/test_dataset.h"

namespace tutti::stager {
namespace {

namespace fs = std::filesystem;

TEST(StagerCoreLeaseTest, RenewalsBeforeAndAfterTheNodeIsLearnedAndTheLeaseReported) {
  const std::string root = ::testing::TempDir() + "/core_lease_" + std::to_string(::getpid());
  fs::remove_all(root);
  fs::create_directories(root);
  testing::Dataset data =
      testing::WriteDataset(root + "/src", {.shards = 1, .samples_per_shard = 4});
  v1::JobInfo job = testing::MakeJob(data, 4, 2);
  job.mutable_config()->set_job_id("coretest-lease");
  StagerOptions o;
  o.node_auto = true;
  o.cache_dir = root + "/cache";
  o.staging.source_dir = data.dir;
  o.decode_threads = 1;
  o.window = 2;
  o.stage_ahead = 0;
  o.lease = absl::Hours(1);
  auto metrics = std::make_shared<StagerMetrics>(std::make_shared<prometheus::Registry>());
  StagerCore core(o, metrics);
  ASSERT_TRUE(core.Start(job).ok());
  EXPECT_EQ(core.GetStageStatus().lease_ms(), 3600000u);

  // Before any AcquireBatch (--node=auto): nothing is held, and a live
  // client's renewals are answered (they must go on), naming every step lost.
  absl::StatusOr<std::vector<uint64_t>> lost = core.RenewLeases(3, 0xA3, {});
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_TRUE(lost->empty());
  lost = core.RenewLeases(3, 0xA3, {0});
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_EQ(*lost, std::vector<uint64_t>{0});
  EXPECT_EQ(core.RenewLeases(3, 0, {}).status().code(), absl::StatusCode::kInvalidArgument);

  // Rank 3 takes step 0 (node 1 learned from it): its renewal holds it.
  absl::Mutex mu;
  std::optional<absl::StatusOr<v1::BatchDescriptor>> held;
  core.AcquireAsync(
      0, 3, 60000,
      [&](absl::StatusOr<v1::BatchDescriptor> r) {
        absl::MutexLock l(&mu);
        held = std::move(r);
      },
      0xA3, true);
  for (uint64_t s = 0; s < 2; ++s) {
    ASSERT_TRUE(core.AddPlan(testing::MakePlan(data, job, s, {2, 3}, 1), 0).ok());
  }
  {
    absl::MutexLock l(&mu);
    mu.Await(absl::Condition(
        +[](std::optional<absl::StatusOr<v1::BatchDescriptor>>* h) { return h->has_value(); },
        &held));
    ASSERT_TRUE(held->ok()) << held->status();
  }
  lost = core.RenewLeases(3, 0xA3, {0, 1});
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_EQ(*lost, std::vector<uint64_t>{1});
  EXPECT_EQ(core.RenewLeases(0, 0xA0, {}).status().code(), absl::StatusCode::kInvalidArgument);
  // A newer process of rank 3 replaces this one: its renewals are refused.
  ASSERT_TRUE(core.RenewLeases(3, 0xB3, {}).ok());
  EXPECT_EQ(core.RenewLeases(3, 0xA3, {0}).status().code(), absl::StatusCode::kFailedPrecondition);
  core.Stop();
  fs::remove_all(root);
}

}  // namespace
}  // namespace tutti::stager
