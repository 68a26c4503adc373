// StagerCore's lease renewals and which process acts for a rank (the lease
// logic itself: batch_window_test.cc; the check: rank_processes_test.cc).
#include <prometheus/registry.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/stager/stager_core.h"
#include "services/stager/test_dataset.h"

namespace tutti::stager {
namespace {

namespace fs = std::filesystem;

// A core of node 1 (ranks 2 and 3) learning its node from its first client,
// with an hour's lease; Plans() hands it those of steps 0 and 1 (its window).
struct LeaseCore {
  std::string root;
  testing::Dataset data;
  v1::JobInfo job;
  std::shared_ptr<StagerMetrics> metrics;
  std::unique_ptr<StagerCore> core;

  explicit LeaseCore(const std::string& name) {
    root = ::testing::TempDir() + "/core_lease_" + name + "_" + std::to_string(::getpid());
    fs::remove_all(root);
    fs::create_directories(root);
    data = testing::WriteDataset(root + "/src", {.shards = 1, .samples_per_shard = 4});
    job = testing::MakeJob(data, 4, 2);
    job.mutable_config()->set_job_id("coretest-lease-" + name);
    StagerOptions o;
    o.node_auto = true;
    o.cache_dir = root + "/cache";
    o.staging.source_dir = data.dir;
    o.decode_threads = 1;
    o.window = 2;
    o.stage_ahead = 0;
    o.lease = absl::Hours(1);
    metrics = std::make_shared<StagerMetrics>(std::make_shared<prometheus::Registry>());
    core = std::make_unique<StagerCore>(o, metrics);
    EXPECT_TRUE(core->Start(job).ok());
  }
  ~LeaseCore() {
    core->Stop();
    fs::remove_all(root);
  }
  void Plans() {
    for (uint64_t s = 0; s < 2; ++s) {
      ASSERT_TRUE(core->AddPlan(testing::MakePlan(data, job, s, {2, 3}, 1), 0).ok());
    }
  }
  ProcessKey Register(uint32_t rank) {
    absl::StatusOr<ProcessKey> p = core->RegisterRank(rank);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.value_or(ProcessKey{});
  }
};

TEST(StagerCoreLeaseTest, RenewalsOfTheRegisteredProcessAndTheLeaseReported) {
  LeaseCore c("renew");
  EXPECT_EQ(c.core->GetStageStatus().lease_ms(), 3600000u);
  // Before any process registered (--node=auto: before the node is known),
  // no renewal names a process the stager knows.
  EXPECT_EQ(c.core->RenewLeases(3, {0xA3, ""}, {0}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.core->RenewLeases(3, {}, {}).status().code(), absl::StatusCode::kInvalidArgument);

  // Rank 3's process registers (node 1 learned from it) and takes step 0:
  // its renewal holds it, and names what it does not hold.
  const ProcessKey p = c.Register(3);
  absl::StatusOr<std::vector<uint64_t>> lost = c.core->RenewLeases(3, p, {});
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_TRUE(lost->empty());
  c.Plans();
  ASSERT_TRUE(c.core->Acquire(0, 3, 60000, p, true).ok());
  lost = c.core->RenewLeases(3, p, {0, 1});
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_EQ(*lost, std::vector<uint64_t>{1});
  EXPECT_EQ(c.core->RenewLeases(0, p, {}).status().code(), absl::StatusCode::kInvalidArgument);
  // A newer process of rank 3 replaces this one: its renewals are refused.
  c.Register(3);
  EXPECT_EQ(c.core->RenewLeases(3, p, {0}).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(StagerCoreLeaseTest, NoOtherProcessRenewsReleasesOrTakesWhatARankHolds) {
  LeaseCore c("forged");
  const ProcessKey p = c.Register(2);
  c.Plans();
  ASSERT_TRUE(c.core->Acquire(0, 2, 60000, p, true).ok());
  ProcessKey stolen = p;  // the incarnation is in the log; the key is not
  stolen.key = std::string(RankProcesses::kKeyBytes, 'x');
  const std::vector<ProcessKey> forged = {{0x5eed, p.key}, {0x5eed, ""}, {}, stolen};
  for (const ProcessKey& f : forged) {
    SCOPED_TRACE(absl::StrCat("incarnation ", absl::Hex(f.incarnation)));
    EXPECT_FALSE(c.core->RenewLeases(2, f, {0}).ok());
    EXPECT_FALSE(c.core->Release(0, 2, f).ok());
    EXPECT_FALSE(c.core->Acquire(2, 2, 100, f).ok());  // would give up steps 0 and 1
    EXPECT_FALSE(c.core->CheckCaller(2, f).ok());
  }
  EXPECT_EQ(c.core->Release(0, 2, {}).code(), absl::StatusCode::kPermissionDenied);
  // Rank 2's process still holds step 0, renews it, and takes step 1 (rank
  // 3 takes no step here: the window builds steps 0 and 1).
  absl::StatusOr<std::vector<uint64_t>> lost = c.core->RenewLeases(2, p, {0});
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_TRUE(lost->empty());
  ASSERT_TRUE(c.core->Release(0, 2, p).ok());
  auto d = c.core->Acquire(1, 2, 60000, p, true);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(c.core->Release(1, 2, p).ok());
}

TEST(StagerCoreLeaseTest, WhatCallsNamingNoProcessDidIsUndoneWhenTheRanksProcessRegisters) {
  LeaseCore c("anonymous");
  c.Register(2);  // the node is learned
  c.Plans();
  // A client that names no process takes rank 3's step 1 (giving up step 0)
  // and holds it, before rank 3's process registers.
  ASSERT_TRUE(c.core->Acquire(1, 3, 60000).ok());
  const ProcessKey p = c.Register(3);
  // Rank 3's process gets every step from step 0 (the window builds steps 0
  // and 1); calls naming none are refused.
  for (uint64_t step = 0; step < 2; ++step) {
    auto d = c.core->Acquire(step, 3, 60000, p);
    ASSERT_TRUE(d.ok()) << "step " << step << ": " << d.status();
    ASSERT_TRUE(c.core->Release(step, 3, p).ok());
  }
  EXPECT_EQ(c.core->Acquire(2, 3, 100).status().code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace tutti::stager
