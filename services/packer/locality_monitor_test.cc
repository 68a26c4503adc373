// The packer's monitor of the stagers' node reports with a fake clock: a
// report is checked, a silent node is removed from the first step not yet
// planned, the change is recorded, and a packer restarted from the record
// plans every step byte for byte as before.
#include "services/packer/locality_monitor.h"

#include <prometheus/registry.h>

#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "gtest/gtest.h"
#include "services/packer/core/planner.h"
#include "services/packer/locality_record.h"
#include "services/packer/plan_proto.h"
#include "services/packer/testing/locality_jobs.h"

namespace tutti::packer {
namespace {

using testing::LocalityJob;
using testing::PlanBytes;

// A packer's locality side as tutti-packerd builds it (packer_server.cc).
struct Side {
  Side(std::shared_ptr<const Job> job, const std::string& path, absl::Time* now,
       prometheus::Registry* registry) {
    auto data = ReadLocalityRecord(path, job->fingerprint());
    EXPECT_TRUE(data.ok()) << data.status();
    auto s = LocalitySchedule::Create(job, data->changes, data->planned_through);
    EXPECT_TRUE(s.ok()) << s.status();
    schedule = *std::move(s);
    record = std::make_unique<LocalityRecord>(path, *data);
    record->Attach(schedule.get(), 4);
    metrics = std::make_unique<PackerMetrics>(*registry);
    LocalityMonitorOptions o;
    o.liveness.dead_after = absl::Seconds(30);
    o.clock = [now] { return *now; };
    monitor = std::make_unique<LocalityMonitor>(job, schedule.get(), metrics.get(), o);
    planner = std::make_unique<Planner>(job, schedule.get());
  }
  std::unique_ptr<LocalitySchedule> schedule;
  std::unique_ptr<LocalityRecord> record;
  std::unique_ptr<PackerMetrics> metrics;
  std::unique_ptr<LocalityMonitor> monitor;
  std::unique_ptr<Planner> planner;
};

v1::NodeReport Report(const Job& job, uint32_t node) {
  v1::NodeReport r;
  r.set_node(node);
  r.set_config_fingerprint(job.fingerprint());
  return r;
}

class LocalityMonitorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("tutti_locality_monitor_", ::getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "locality.record").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(LocalityMonitorTest, ReportsAreChecked) {
  auto job = LocalityJob();
  absl::Time now = absl::FromUnixSeconds(1000);
  prometheus::Registry registry;
  Side side(job, path_, &now, &registry);
  v1::NodeReport r = Report(*job, 8);
  EXPECT_EQ(side.monitor->Report(r).code(), absl::StatusCode::kInvalidArgument);
  r = Report(*job, 1);
  r.set_config_fingerprint("another");
  EXPECT_EQ(side.monitor->Report(r).code(), absl::StatusCode::kFailedPrecondition);
  r = Report(*job, 1);
  for (int i = 0; i <= kMaxReportedShardNames; ++i) r.add_refused_shard_names("s");
  EXPECT_EQ(side.monitor->Report(r).code(), absl::StatusCode::kInvalidArgument);
  r = Report(*job, 1);
  r.add_refused_shard_names(std::string(kMaxReportedShardName + 1, 's'));
  EXPECT_EQ(side.monitor->Report(r).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(side.monitor->Report(Report(*job, 1)).ok());
  EXPECT_DOUBLE_EQ(side.metrics->locality_reports_rejected.Value(), 4);
  EXPECT_DOUBLE_EQ(side.metrics->locality_reports_accepted.Value(), 1);
  EXPECT_TRUE(side.schedule->homes()->changes().empty());
}

TEST_F(LocalityMonitorTest, ASilentNodeIsRemovedRecordedAndReplayedAfterARestart) {
  auto job = LocalityJob();
  absl::Time now = absl::FromUnixSeconds(1000);
  std::vector<std::string> plans;
  {
    prometheus::Registry registry;
    Side side(job, path_, &now, &registry);
    for (uint32_t n = 0; n < 8; ++n) ASSERT_TRUE(side.monitor->Report(Report(*job, n)).ok());
    for (uint64_t step = 0; step < 3; ++step) plans.push_back(PlanBytes(*side.planner, step));
    now += absl::Seconds(20);
    for (uint32_t n = 0; n < 8; ++n) {
      if (n != 5) ASSERT_TRUE(side.monitor->Report(Report(*job, n)).ok());
    }
    side.monitor->Tick();
    EXPECT_TRUE(side.schedule->homes()->changes().empty());  // 20 s: not yet
    now += absl::Seconds(15);
    side.monitor->Tick();  // node 5 silent for 35 s; the others for 15 s
    ASSERT_EQ(side.schedule->homes()->changes().size(), 1u);
    const LocalityChange c = side.schedule->homes()->changes()[0];
    EXPECT_EQ(c.kind, LocalityChange::Kind::kRemove);
    EXPECT_EQ(c.node, 5u);
    EXPECT_EQ(c.from_step, 3u);
    EXPECT_DOUBLE_EQ(side.metrics->locality_rehomings_family.Add({{"reason", "dead"}}).Value(), 1);
    EXPECT_DOUBLE_EQ(side.metrics->locality_nodes_family.Add({{"state", "removed"}}).Value(), 1);
    EXPECT_DOUBLE_EQ(side.metrics->locality_change_from_step.Value(), 3);
    side.monitor->Tick();  // not announced twice
    EXPECT_EQ(side.schedule->homes()->changes().size(), 1u);
    for (uint64_t step = 3; step < 6; ++step) plans.push_back(PlanBytes(*side.planner, step));
    const auto homes = side.schedule->homes();
    EXPECT_FALSE(homes->HomesAt(2).ShardsOf(5).empty());
    EXPECT_TRUE(homes->HomesAt(3).ShardsOf(5).empty());
    auto text = ReadFileToString(path_);
    ASSERT_TRUE(text.ok());
    EXPECT_NE(text->find("remove 5 3\n"), std::string::npos) << *text;
    // Node 5 reports again: added back from the next unplanned step.
    now += absl::Seconds(1);
    ASSERT_TRUE(side.monitor->Report(Report(*job, 5)).ok());
    ASSERT_EQ(side.schedule->homes()->changes().size(), 2u);
    EXPECT_EQ(side.schedule->homes()->changes()[1].kind, LocalityChange::Kind::kAdd);
    EXPECT_EQ(side.schedule->homes()->changes()[1].from_step, 6u);
    for (uint64_t step = 6; step < 8; ++step) plans.push_back(PlanBytes(*side.planner, step));
  }
  // The restarted packer: the same plans for every step, in any order.
  prometheus::Registry registry;
  Side again(job, path_, &now, &registry);
  for (uint64_t step : {7, 0, 3, 6, 1, 5, 2, 4}) {
    EXPECT_EQ(PlanBytes(*again.planner, step), plans[step]) << "step " << step;
  }
  // A packer without the record plans the steps after the removal otherwise.
  Planner plain(job);
  EXPECT_EQ(PlanBytes(plain, 2), plans[2]);
  EXPECT_NE(PlanBytes(plain, 4), plans[4]);
}

TEST_F(LocalityMonitorTest, AFullCacheIsReHomedWithinItsCapacityOrLoggedAndCounted) {
  auto job = LocalityJob();
  absl::Time now = absl::FromUnixSeconds(1000);
  prometheus::Registry registry;
  Side side(job, path_, &now, &registry);
  PlanBytes(*side.planner, 0);
  const uint64_t assigned = side.schedule->homes()->HomesAt(0).BytesOf(2);
  v1::NodeReport r = Report(*job, 2);
  r.set_cache_capacity_bytes(assigned / 2);
  ASSERT_TRUE(side.monitor->Report(r).ok());
  ASSERT_EQ(side.schedule->homes()->changes().size(), 1u);
  EXPECT_EQ(side.schedule->homes()->changes()[0].kind, LocalityChange::Kind::kCapacity);
  EXPECT_LE(side.schedule->homes()->HomesAt(1).BytesOf(2), assigned / 2);
  EXPECT_DOUBLE_EQ(side.metrics->locality_rehomings_family.Add({{"reason", "capacity"}}).Value(),
                   1);
  // Reported again: already within it, nothing more.
  ASSERT_TRUE(side.monitor->Report(r).ok());
  EXPECT_EQ(side.schedule->homes()->changes().size(), 1u);
  // Every node far too small: refused, logged and counted, the job goes on.
  for (uint32_t n = 0; n < 8; ++n) {
    v1::NodeReport tiny = Report(*job, n);
    tiny.set_cache_capacity_bytes(1 << 20);
    ASSERT_TRUE(side.monitor->Report(tiny).ok());
  }
  EXPECT_GE(side.metrics->locality_rehomings_refused_family.Add({{"reason", "capacity"}}).Value(),
            1);
  EXPECT_TRUE(PlanBytes(*side.planner, 1).size() > 100);
}

}  // namespace
}  // namespace tutti::packer
