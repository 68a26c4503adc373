// Plans with locality (job.proto, LocalityConfig): each shard's home nodes
// stage it, the encoder phase prefers their ranks, a remote load names its
// holder node, plans stay deterministic and node removals re-home shards
// from their step on.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/packer/core/home_staging.h"
#include "services/packer/core/plan_check.h"
#include "services/packer/core/planner.h"
#include "services/packer/plan_proto.h"
#include "services/packer/testing/locality_jobs.h"

namespace tutti::packer {
namespace {

using testing::Config;
using testing::LocalityDataset;
using testing::LocalityJobText;

std::shared_ptr<const Job> MustJob(const std::string& text, JobOptions o = {}) {
  auto job = Job::Create(Config(text), LocalityDataset(), o);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : nullptr;
}

// Images whose encoder rank's node is not a home of their shard, and images.
struct Remote {
  uint32_t images = 0, remote = 0;
};
Remote CountRemote(const StepPlanData& d, const ShardHomes& homes, uint32_t rpn) {
  Remote r;
  for (const PlannedImage& im : d.images) {
    ++r.images;
    if (!homes.IsHome(d.samples[im.owner].shard, im.enc_rank / rpn)) ++r.remote;
  }
  return r;
}

constexpr const char* kPost = "post_balancing { enabled: true }";
constexpr const char* kLocality = "locality { home_replication: 1 }";

// At the default balance tolerance (0.01%) and at 2%: the fraction of
// images the node-oblivious placement puts off their home node that the
// locality-aware one still does is at most `most` (this small step has ~115
// images over 8 nodes, so balance alone forces many off their home node).
class PostBalancingLocality : public ::testing::TestWithParam<std::pair<const char*, double>> {};

TEST_P(PostBalancingLocality, PlacesImagesOnHomeNodes) {
  const std::string text = LocalityJobText(absl::StrCat(GetParam().first, " ", kLocality));
  const double most = GetParam().second;
  auto on = MustJob(text);
  // The same placement algorithm, node-oblivious: where the homes would put
  // images without preferring them.
  JobOptions oblivious;
  oblivious.node_aware = false;
  auto blind = MustJob(text, oblivious);
  ASSERT_NE(on, nullptr);
  ASSERT_NE(blind, nullptr);
  ASSERT_NE(on->homes(), nullptr);
  const ShardHomes& homes = on->homes()->HomesAt(0);
  Planner planner(on), blind_planner(blind);
  Remote with, without;
  for (uint64_t step = 0; step < 6; ++step) {
    StepPlanData d, b;
    ASSERT_TRUE(planner.Plan(step, &d).ok());
    ASSERT_TRUE(blind_planner.Plan(step, &b).ok());
    PlanCheckOptions check;
    check.staging = &on->homes()->At(step);
    ASSERT_TRUE(CheckPlannedStep(d, check).ok()) << CheckPlannedStep(d, check);
    const Remote r = CountRemote(d, homes, 2), o = CountRemote(b, homes, 2);
    with.images += r.images;
    with.remote += r.remote;
    without.images += o.images;
    without.remote += o.remote;
    // Each image is remote exactly when its node is no home, and then names
    // a home node as its holder.
    v1::StepPlan plan;
    ASSERT_TRUE(BuildStepPlan(*on, d, {}, &plan).ok());
    uint32_t holders = 0;
    std::map<uint64_t, uint32_t> shard_of;  // sample id -> StepPlan.shards
    for (const v1::SampleInfo& si : plan.samples()) shard_of[si.sample_id()] = si.shard();
    for (const v1::ShardRef& ref : plan.shards()) EXPECT_EQ(ref.home_nodes_size(), 1);
    for (const v1::RankPlan& rp : plan.ranks()) {
      for (const v1::EncoderPhase& ph : rp.encoders()) {
        for (const v1::ImagePlan& ip : ph.images()) {
          EXPECT_EQ(ip.has_holder_node(), ip.remote_load());
          if (!ip.remote_load()) continue;
          ++holders;
          EXPECT_EQ(ip.holder_node(), plan.shards(shard_of[ip.sample_id()]).home_nodes(0));
        }
      }
    }
    EXPECT_EQ(holders, r.remote);
    for (const PlannedImage& im : d.images) {
      if (im.remote_load) {
        EXPECT_TRUE(homes.IsHome(d.samples[im.owner].shard, im.load_source / 2));
      }
    }
  }
  ASSERT_GT(with.images, 500u);
  EXPECT_EQ(with.images, without.images);
  // Node-oblivious, about 7 in 8 images land off their home node.
  EXPECT_GT(without.remote, with.images / 2);
  EXPECT_LT(with.remote, most * without.remote)
      << with.remote << " of " << with.images << " remote, " << without.remote << " without";
}

INSTANTIATE_TEST_SUITE_P(
    Tolerances, PostBalancingLocality,
    ::testing::Values(std::make_pair("post_balancing { enabled: true }", 0.75),
                      std::make_pair("post_balancing { enabled: true balance_tolerance: 0.02 }",
                                     0.5)));

TEST(LocalityTest, ColocatedPacksRanksOntoHomeNodesWithTheSameBalance) {
  auto on = MustJob(LocalityJobText(kLocality));
  ASSERT_NE(on, nullptr);
  const ShardHomes& homes = on->homes()->HomesAt(0);
  // Everything staged everywhere: the strategy's own rank bins.
  struct Everywhere final : ShardStaging {
    dispatch::ShardAvailability At(uint64_t) const override { return {}; }
  } everywhere;
  Planner planner(on), plain(on, &everywhere);
  Remote with, without;
  for (uint64_t step = 0; step < 6; ++step) {
    StepPlanData d, p;
    ASSERT_TRUE(planner.Plan(step, &d).ok());
    ASSERT_TRUE(plain.Plan(step, &p).ok());
    PlanCheckOptions check;
    check.staging = &on->homes()->At(step);
    ASSERT_TRUE(CheckPlannedStep(d, check).ok()) << CheckPlannedStep(d, check);
    const Remote r = CountRemote(d, homes, 2), o = CountRemote(p, homes, 2);
    with.images += r.images;
    with.remote += r.remote;
    without.images += o.images;
    without.remote += o.remote;
    // A permutation of the ranks: the same per-rank costs, reordered.
    std::multiset<double> a, b;
    for (const RankTotals& t : d.ranks) a.insert(t.vit + t.llm);
    for (const RankTotals& t : p.ranks) b.insert(t.vit + t.llm);
    EXPECT_EQ(a, b) << "step " << step;
    EXPECT_EQ(d.vit.max, p.vit.max);
    EXPECT_EQ(d.llm.max, p.llm.max);
  }
  EXPECT_EQ(with.images, without.images);
  EXPECT_LT(with.remote, without.remote);
}

std::vector<std::string> Hashes(const std::shared_ptr<const Job>& job,
                                const std::vector<uint64_t>& steps) {
  Planner planner(job);
  std::vector<std::string> out;
  for (uint64_t step : steps) {
    StepPlanData d;
    v1::StepPlan plan;
    absl::Status s = planner.Plan(step, &d);
    if (s.ok()) s = BuildStepPlan(*job, d, {}, &plan);
    out.push_back(s.ok() ? PlanHash(&plan) : s.ToString());
  }
  return out;
}

TEST(LocalityTest, PlansAreDeterministicAndARestartedPackerAgrees) {
  const std::string text =
      LocalityJobText(absl::StrCat(kPost, " locality { home_replication: 2 }"));
  const auto first = Hashes(MustJob(text), {0, 1, 2, 3, 4, 5});
  // A restarted packer: another job object, steps planned from the middle.
  const auto restarted = Hashes(MustJob(text), {3, 4, 5, 0, 1, 2});
  EXPECT_EQ(std::vector<std::string>(first.begin() + 3, first.end()),
            std::vector<std::string>(restarted.begin(), restarted.begin() + 3));
  EXPECT_EQ(std::vector<std::string>(first.begin(), first.begin() + 3),
            std::vector<std::string>(restarted.begin() + 3, restarted.end()));
  // Locality changes the plans; off, they are what they were.
  EXPECT_NE(Hashes(MustJob(LocalityJobText(kPost)), {0}), Hashes(MustJob(text), {0}));
  EXPECT_EQ(MustJob(LocalityJobText(kPost))->homes(), nullptr);
  auto off = MustJob(LocalityJobText(kPost));
  StepPlanData d;
  v1::StepPlan plan;
  ASSERT_TRUE(Planner(off).Plan(0, &d).ok());
  ASSERT_TRUE(BuildStepPlan(*off, d, {}, &plan).ok());
  for (const v1::ShardRef& ref : plan.shards()) EXPECT_EQ(ref.home_nodes_size(), 0);
}

TEST(LocalityTest, ARemovedNodeIsReHomedFromItsStep) {
  const std::string text = LocalityJobText(absl::StrCat(kPost, " ", kLocality));
  JobOptions o;
  auto removals = ParseNodeRemovals("3@4");
  ASSERT_TRUE(removals.ok());
  o.node_removals = *removals;
  auto removed = MustJob(text, o);
  auto kept = MustJob(text);
  ASSERT_NE(removed, nullptr);
  const HomeStaging& h = *removed->homes();
  EXPECT_TRUE(h.ExcludedAt(3).empty());
  EXPECT_EQ(h.ExcludedAt(4), std::vector<uint32_t>{3});
  EXPECT_TRUE(h.HomesAt(4).ShardsOf(3).empty());
  EXPECT_FALSE(h.HomesAt(3).ShardsOf(3).empty());
  // Only node 3's shards moved.
  for (uint32_t s = 0; s < h.HomesAt(0).shards(); ++s) {
    if (h.HomesAt(0).Homes(s)[0] != 3)
      EXPECT_EQ(h.HomesAt(0).Homes(s)[0], h.HomesAt(4).Homes(s)[0]);
  }
  // Steps before the removal plan as without it; from it on, nothing is
  // read from node 3's stager and every sample is still planned.
  EXPECT_EQ(Hashes(removed, {0, 1, 2, 3}), Hashes(kept, {0, 1, 2, 3}));
  Planner planner(removed), before(kept);
  for (uint64_t step = 4; step < 7; ++step) {
    StepPlanData d, k;
    ASSERT_TRUE(planner.Plan(step, &d).ok());
    ASSERT_TRUE(before.Plan(step, &k).ok());
    PlanCheckOptions check;
    check.staging = &h.At(step);
    ASSERT_TRUE(CheckPlannedStep(d, check).ok()) << CheckPlannedStep(d, check);
    EXPECT_EQ(d.samples.size(), k.samples.size());
    for (uint32_t i = 0; i < d.num_load_items(); ++i) {
      if (d.IsRemoteLoad(i)) EXPECT_NE(d.LoadSource(i) / 2, 3u) << "step " << step;
    }
  }
  // Refusals: a node the job lacks, removals without locality.
  o.node_removals = {{8, 1}};
  EXPECT_FALSE(Job::Create(Config(text), LocalityDataset(), o).ok());
  o.node_removals = {{1, 1}};
  auto refused = Job::Create(Config(LocalityJobText(kPost)), LocalityDataset(), o);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ParseNodeRemovals("3").ok());
  EXPECT_FALSE(ParseNodeRemovals("a@1").ok());
}

TEST(LocalityTest, ACacheTooSmallForTheDatasetIsRefusedAtLoad) {
  uint64_t total = 0;
  for (const IndexShard& s : LocalityDataset()->shards()) total += s.size;
  // 8 nodes holding 2 copies need 2 x total / 8 each.
  auto job =
      Job::Create(Config(LocalityJobText(absl::StrCat(
                      "locality { home_replication: 2 node_cache_bytes: ", total / 5, " }"))),
                  LocalityDataset());
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(job.status().message().find("raise the per-node cache capacity"), std::string::npos)
      << job.status();
  EXPECT_TRUE(
      Job::Create(Config(LocalityJobText(absl::StrCat(
                      "locality { home_replication: 2 node_cache_bytes: ", total / 2, " }"))),
                  LocalityDataset())
          .ok());
}

// The names of a plan's held_shards, in order.
std::vector<std::string> HeldNames(const v1::StepPlan& plan) {
  std::vector<std::string> out;
  for (const v1::ShardRef& ref : plan.held_shards()) out.push_back(ref.name());
  return out;
}

// Every shard the step reads (on any rank) is in the plan cut for a node's
// ranks exactly when the node is one of its homes, in the step's first-use
// order, with its size and homes; also shards none of the node's own ranks
// read (those only other nodes' ranks read, which its stager serves).
// Without locality no plan lists any.
TEST(LocalityTest, PlansListTheShardsEachNodeIsHomeToThatTheStepReadsAnywhere) {
  for (const char* mode : {kPost, ""}) {
    SCOPED_TRACE(mode);
    auto job = MustJob(LocalityJobText(absl::StrCat(mode, " locality { home_replication: 2 }")));
    ASSERT_NE(job, nullptr);
    const Index& ix = job->index();
    Planner planner(job);
    uint32_t only_others = 0;
    for (uint64_t step = 0; step < 4; ++step) {
      StepPlanData d;
      ASSERT_TRUE(planner.Plan(step, &d).ok());
      const ShardHomes& homes = job->homes()->HomesAt(step);
      // What the step reads, from its samples, in first-use order.
      std::vector<uint32_t> read;
      for (const PlannedSample& ps : d.samples) {
        const uint32_t shard = ix.ShardOf(ps.sample);
        if (std::find(read.begin(), read.end(), shard) == read.end()) read.push_back(shard);
      }
      ASSERT_GT(read.size(), 8u);
      std::map<std::string, uint32_t> times_held;  // over the 8 nodes' plans
      for (uint32_t node = 0; node < 8; ++node) {
        SCOPED_TRACE(absl::StrCat("step ", step, " node ", node));
        v1::StepPlan plan, one;
        ASSERT_TRUE(
            BuildStepPlan(*job, d, std::vector<uint32_t>{2 * node, 2 * node + 1}, &plan).ok());
        std::vector<std::string> want;
        for (uint32_t shard : read) {
          if (homes.IsHome(shard, node)) want.push_back(ix.shard(shard).name);
        }
        EXPECT_EQ(HeldNames(plan), want);
        std::set<std::string> own;
        for (const v1::ShardRef& ref : plan.shards()) own.insert(ref.name());
        for (const v1::ShardRef& ref : plan.held_shards()) {
          ++times_held[ref.name()];
          only_others += own.count(ref.name()) == 0;
          ASSERT_EQ(ref.home_nodes_size(), 2);
          EXPECT_TRUE(ref.home_nodes(0) == node || ref.home_nodes(1) == node);
          EXPECT_GT(ref.size(), 0u);
        }
        // One rank of the node: the same list (the node's stager may ask
        // for any of its ranks).
        ASSERT_TRUE(BuildStepPlan(*job, d, std::vector<uint32_t>{2 * node + 1}, &one).ok());
        EXPECT_EQ(HeldNames(one), want);
      }
      // Each shard the step reads, once per home node (2), none other.
      EXPECT_EQ(times_held.size(), read.size());
      for (const auto& [name, n] : times_held) EXPECT_EQ(n, 2u) << name;
      // All ranks: every shard the step reads, in first-use order.
      v1::StepPlan all;
      ASSERT_TRUE(BuildStepPlan(*job, d, {}, &all).ok());
      std::vector<std::string> every;
      for (uint32_t shard : read) every.push_back(ix.shard(shard).name);
      EXPECT_EQ(HeldNames(all), every);
    }
    // The step reads shards some node's ranks do not touch but it is home to.
    EXPECT_GT(only_others, 0u);
    // Without locality: none, for any cut of the plan.
    auto off = MustJob(LocalityJobText(mode));
    StepPlanData d;
    ASSERT_TRUE(Planner(off).Plan(0, &d).ok());
    EXPECT_TRUE(d.step_shards.empty());
    for (const std::vector<uint32_t>& ranks :
         {std::vector<uint32_t>{}, std::vector<uint32_t>{0, 1}, std::vector<uint32_t>{5}}) {
      v1::StepPlan plan;
      ASSERT_TRUE(BuildStepPlan(*off, d, ranks, &plan).ok());
      EXPECT_EQ(plan.held_shards_size(), 0);
    }
  }
}

}  // namespace
}  // namespace tutti::packer
