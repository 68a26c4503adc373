// Node faults with locality: the changes the stagers' reports call for
// (node_liveness.h, with a fake clock) and the schedule that takes them
// from the first step not yet planned (locality_schedule.h).
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/packer/core/locality_schedule.h"
#include "services/packer/core/node_liveness.h"
#include "services/packer/core/planner.h"
#include "services/packer/plan_proto.h"
#include "services/packer/testing/locality_jobs.h"

namespace tutti::packer {
namespace {

using testing::LocalityDataset;
using testing::LocalityJob;
using testing::PlanBytes;

constexpr uint64_t kLatest = std::numeric_limits<uint64_t>::max();

// Nodes of loads that are remote in a planned step.
std::vector<uint32_t> HolderNodes(const Planner& planner, uint64_t step) {
  StepPlanData d;
  EXPECT_TRUE(planner.Plan(step, &d).ok());
  std::vector<uint32_t> out;
  for (uint32_t i = 0; i < d.num_load_items(); ++i) {
    if (d.IsRemoteLoad(i)) out.push_back(d.LoadSource(i) / 2);
  }
  return out;
}

TEST(NodeLivenessTest, ASilentNodeThatReportedBeforeIsDeadOnlyAfterTheDelay) {
  auto job = LocalityJob();
  auto homes = HomeStaging::Create(job->config(), job->index());
  ASSERT_TRUE(homes.ok());
  NodeLiveness live(8, {absl::Seconds(30)});
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(live.Due(t0 + absl::Hours(1), **homes).empty());  // nobody reported yet
  for (uint32_t n = 0; n < 8; ++n) live.Report({n}, t0);
  EXPECT_TRUE(live.Due(t0 + absl::Seconds(30), **homes).empty());
  for (uint32_t n = 0; n < 8; ++n) {
    if (n != 5) live.Report({n}, t0 + absl::Seconds(20));
  }
  const std::vector<ProposedChange> due = live.Due(t0 + absl::Seconds(31), **homes);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].change.kind, LocalityChange::Kind::kRemove);
  EXPECT_EQ(due[0].change.node, 5u);
  EXPECT_EQ(due[0].reason, "dead");
  // Zero: never dead.
  NodeLiveness never(8, {absl::ZeroDuration()});
  never.Report({5}, t0);
  EXPECT_TRUE(never.Due(t0 + absl::Hours(100), **homes).empty());
}

TEST(NodeLivenessTest, ARemovedNodeReportingAgainIsAddedBackUnlessTheOperatorRemovedIt) {
  auto job = LocalityJob();
  auto homes = HomeStaging::Create(
      job->config(), job->index(),
      {{LocalityChange::Kind::kRemove, 5, 3, 0}, {LocalityChange::Kind::kRemove, 6, 3, 0}});
  ASSERT_TRUE(homes.ok());
  NodeLiveness live(8, {absl::Seconds(30)}, /*operator_removed=*/{6});
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  live.Report({5}, t0);
  live.Report({6}, t0);
  const std::vector<ProposedChange> due = live.Due(t0, **homes);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].change.kind, LocalityChange::Kind::kAdd);
  EXPECT_EQ(due[0].change.node, 5u);
  EXPECT_EQ(due[0].reason, "returned");
  // Refused: not proposed again until the node reports again.
  live.Refused(due[0].change);
  EXPECT_TRUE(live.Due(t0, **homes).empty());
  live.Report({5}, t0 + absl::Seconds(1));
  EXPECT_EQ(live.Due(t0 + absl::Seconds(1), **homes).size(), 1u);
}

TEST(NodeLivenessTest, ACacheSmallerThanItsHomesOrRefusingShardsAsksForItsCapacity) {
  auto job = LocalityJob();
  auto homes = HomeStaging::Create(job->config(), job->index());
  ASSERT_TRUE(homes.ok());
  const uint64_t assigned = (*homes)->HomesAt(0).BytesOf(2);
  ASSERT_GT(assigned, 0u);
  NodeLiveness live(8, {absl::Seconds(30)});
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  live.Report({2, /*capacity=*/assigned, /*held=*/0, 0}, t0);  // fits
  live.Report({3, /*capacity=*/0, /*held=*/1, 0}, t0);         // unbounded
  EXPECT_TRUE(live.Due(t0, **homes).empty());
  live.Report({2, assigned / 2, 0, 0}, t0);
  std::vector<ProposedChange> due = live.Due(t0, **homes);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].change.kind, LocalityChange::Kind::kCapacity);
  EXPECT_EQ(due[0].change.capacity_bytes, assigned / 2);
  // Shards refused for want of space: what it holds is what it can hold.
  const uint64_t held3 = (*homes)->HomesAt(0).BytesOf(3) / 3;
  live.Report({3, 0, held3, /*refused=*/2}, t0);
  due = live.Due(t0, **homes);
  ASSERT_EQ(due.size(), 2u);
  EXPECT_EQ(due[1].change.node, 3u);
  EXPECT_EQ(due[1].change.capacity_bytes, held3);
}

TEST(LocalityScheduleTest, AChangeTakesEffectAtTheFirstStepNotYetPlanned) {
  auto job = LocalityJob();
  auto schedule = LocalitySchedule::Create(job, {});
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  Planner planner(job, schedule->get());
  Planner fixed(job);  // the job's own homes, never changed
  std::vector<std::string> before;
  for (uint64_t step = 0; step < 4; ++step) before.push_back(PlanBytes(planner, step));
  EXPECT_EQ((*schedule)->planned_through(), 4u);
  absl::StatusOr<uint64_t> from = (*schedule)->Announce({{LocalityChange::Kind::kRemove, 3, 0, 0}});
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_EQ(*from, 4u);
  // Steps planned (or served) before keep their plans, byte for byte, and
  // equal the plans without the change.
  for (uint64_t step = 0; step < 4; ++step) {
    EXPECT_EQ(PlanBytes(planner, step), before[step]) << step;
    EXPECT_EQ(PlanBytes(fixed, step), before[step]) << step;
  }
  const std::shared_ptr<const HomeStaging> homes = (*schedule)->homes();
  EXPECT_FALSE(homes->HomesAt(3).ShardsOf(3).empty());
  EXPECT_TRUE(homes->HomesAt(4).ShardsOf(3).empty());
  // Only node 3's shards moved.
  for (uint32_t s = 0; s < homes->HomesAt(0).shards(); ++s) {
    if (homes->HomesAt(3).Homes(s)[0] != 3) {
      EXPECT_EQ(homes->HomesAt(3).Homes(s)[0], homes->HomesAt(4).Homes(s)[0]);
    }
  }
  for (uint64_t step = 4; step < 7; ++step) {
    for (uint32_t node : HolderNodes(planner, step)) EXPECT_NE(node, 3u) << "step " << step;
    StepPlanData d;
    v1::StepPlan plan;
    ASSERT_TRUE(planner.Plan(step, &d).ok());
    ASSERT_TRUE(BuildStepPlan(*job, d, {}, &plan).ok());
    for (const v1::ShardRef& ref : plan.shards()) {
      for (uint32_t n : ref.home_nodes()) EXPECT_NE(n, 3u) << ref.name();
    }
  }
}

TEST(LocalityScheduleTest, AReturningNodeGetsItsShardsBackAndOnlyThose) {
  auto job = LocalityJob();
  auto schedule = LocalitySchedule::Create(job, {});
  ASSERT_TRUE(schedule.ok());
  Planner planner(job, schedule->get());
  PlanBytes(planner, 0);
  ASSERT_EQ(*(*schedule)->Announce({{LocalityChange::Kind::kRemove, 3, 0, 0}}), 1u);
  PlanBytes(planner, 1);
  PlanBytes(planner, 2);
  ASSERT_EQ(*(*schedule)->Announce({{LocalityChange::Kind::kAdd, 3, 0, 0}}), 3u);
  const auto homes = (*schedule)->homes();
  EXPECT_EQ(homes->ExcludedAt(2), std::vector<uint32_t>{3});
  EXPECT_TRUE(homes->ExcludedAt(3).empty());
  for (uint32_t s = 0; s < homes->HomesAt(0).shards(); ++s) {
    EXPECT_EQ(homes->HomesAt(0).Homes(s)[0], homes->HomesAt(3).Homes(s)[0]) << s;
  }
  // A node the job lacks, or removing every node, is refused and changes
  // nothing.
  EXPECT_FALSE((*schedule)->Announce({{LocalityChange::Kind::kRemove, 8, 0, 0}}).ok());
  std::vector<LocalityChange> all;
  for (uint32_t n = 0; n < 8; ++n) all.push_back({LocalityChange::Kind::kRemove, n, 0, 0});
  EXPECT_FALSE((*schedule)->Announce(all).ok());
  EXPECT_EQ((*schedule)->homes()->changes().size(), 2u);
}

TEST(LocalityScheduleTest, ACapacityReHomesWithinItOrIsRefused) {
  auto job = LocalityJob();
  auto schedule = LocalitySchedule::Create(job, {});
  ASSERT_TRUE(schedule.ok());
  Planner planner(job, schedule->get());
  PlanBytes(planner, 0);
  const uint64_t assigned = (*schedule)->homes()->HomesAt(0).BytesOf(2);
  uint64_t total = 0;
  for (const IndexShard& s : LocalityDataset()->shards()) total += s.size;
  absl::StatusOr<uint64_t> from =
      (*schedule)->Announce({{LocalityChange::Kind::kCapacity, 2, 0, assigned / 2}});
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_EQ(*from, 1u);
  const auto homes = (*schedule)->homes();
  EXPECT_EQ(homes->HomesAt(0).BytesOf(2), assigned);
  EXPECT_LE(homes->HomesAt(1).BytesOf(2), assigned / 2);
  EXPECT_GT(homes->HomesAt(1).BytesOf(2), 0u);
  EXPECT_EQ(homes->CapacityAt(1, 2), assigned / 2);
  // Every node that small cannot hold the dataset: refused, nothing taken.
  std::vector<LocalityChange> tiny;
  for (uint32_t n = 0; n < 8; ++n) {
    tiny.push_back({LocalityChange::Kind::kCapacity, n, 0, total / 16});
  }
  absl::StatusOr<uint64_t> refused = (*schedule)->Announce(tiny);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_EQ((*schedule)->homes()->changes().size(), 1u);
}

TEST(LocalityScheduleTest, TheSameChangesAndWatermarkPlanTheSameSteps) {
  auto job = LocalityJob();
  std::vector<LocalityChange> recorded;
  uint64_t reserved = 0;
  auto schedule = LocalitySchedule::Create(job, {});
  ASSERT_TRUE(schedule.ok());
  (*schedule)->SetRecord(
      [&](const std::vector<LocalityChange>& c) {
        recorded.insert(recorded.end(), c.begin(), c.end());
        return absl::OkStatus();
      },
      [&](uint64_t through) {
        reserved = through;
        return absl::OkStatus();
      },
      /*reserve_chunk=*/4);
  Planner planner(job, schedule->get());
  std::vector<std::string> plans;
  for (uint64_t step = 0; step < 3; ++step) plans.push_back(PlanBytes(planner, step));
  ASSERT_TRUE((*schedule)->Announce({{LocalityChange::Kind::kRemove, 6, 0, 0}}).ok());
  for (uint64_t step = 3; step < 6; ++step) plans.push_back(PlanBytes(planner, step));
  EXPECT_EQ(reserved, 8u);  // steps 0 and 4 reserved through 4 and 8
  ASSERT_EQ(recorded.size(), 1u);
  EXPECT_EQ(recorded[0].from_step, 3u);
  // A restarted packer from the record.
  auto again = LocalitySchedule::Create(job, recorded, reserved);
  ASSERT_TRUE(again.ok());
  Planner replay(job, again->get());
  for (uint64_t step : {5, 0, 4, 1, 3, 2}) EXPECT_EQ(PlanBytes(replay, step), plans[step]) << step;
  // Its first change lands after every step its predecessor may have planned.
  EXPECT_EQ(*(*again)->Announce({{LocalityChange::Kind::kAdd, 6, 0, 0}}), 8u);
  // A reservation that cannot be recorded stops changes; plans go on.
  (*schedule)->SetRecord(
      nullptr, [](uint64_t) { return absl::UnavailableError("disk"); }, 4);
  PlanBytes(planner, 20);
  EXPECT_EQ((*schedule)->Announce({{LocalityChange::Kind::kAdd, 6, 0, 0}}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tutti::packer
