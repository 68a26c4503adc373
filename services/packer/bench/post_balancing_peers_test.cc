// Post-balancing against the peers `tutti bench packer --post-balancing`
// compares it with (lpt, kk, multipack re-dealing each phase with their own
// balancer, node-oblivious; dispatcher.h MakePeerRedealDispatcher), on the
// same drawn steps of the seed workload: in each phase tutti's slowest rank
// is no slower than the best peer's, step by step, and its plans move fewer
// bytes between nodes than any peer's.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/packer/bench/bench_workload.h"
#include "services/packer/bench/staging.h"
#include "services/packer/core/job.h"
#include "services/packer/core/plan_check.h"
#include "services/packer/core/planner.h"

namespace tutti::packer {
namespace {

// tutti's local searches stop within 0.01% of each phase's lower bound.
constexpr double kSlack = 1e-4;

// Enough samples for two steps' draws of W = 256 at every stage.
std::shared_ptr<const Index> SeedIndex() {
  static auto* index = new std::shared_ptr<const Index>([] {
    auto ix = MakeSeedIndex(SeedWorkloadOptions(), 150000);
    EXPECT_TRUE(ix.ok()) << ix.status();
    return ix.ok() ? *ix : nullptr;
  }());
  return *index;
}

struct StepFigures {
  double vit = 0, llm = 0;  // slowest rank over the phase's lower bound
  uint64_t bytes = 0;       // between nodes: forward and load exchange
};

// Plans `steps` steps of the seed job at W ranks and max_pixels with
// post-balancing: tutti's (peer empty) or the peer's re-deal. `tolerance`
// < 0 leaves post_balancing.balance_tolerance at its default.
std::vector<StepFigures> PlanSteps(uint32_t W, uint64_t max_pixels, const std::string& peer,
                                   uint64_t steps, double tolerance = -1,
                                   const ShardStaging* staging = nullptr) {
  std::vector<StepFigures> out;
  const SeedWorkloadOptions wo;
  auto shape = SeedShape(wo, *SeedIndex(), W, max_pixels);
  EXPECT_TRUE(shape.ok()) << shape.status();
  if (!shape.ok()) return out;
  v1::JobConfig config = SeedConfig(wo, *shape, W, max_pixels, "tutti", 1, true);
  if (tolerance >= 0) config.mutable_post_balancing()->set_balance_tolerance(tolerance);
  JobOptions options;
  options.post_balancing_peer = peer;
  auto job = Job::Create(config, SeedIndex(), options);
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return out;
  Planner planner(*job, staging);
  StepPlanData d;
  for (uint64_t s = 0; s < steps; ++s) {
    absl::Status st = planner.Plan(s, &d);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return out;
    EXPECT_FALSE(d.overflow.fallback_packing) << "W=" << W << " step " << s << " " << peer;
    PlanCheckOptions check;
    dispatch::ShardAvailability at;
    if (staging != nullptr) {
      at = staging->At(s);
      check.staging = &at;
    }
    const absl::Status valid = CheckPlannedStep(d, check);
    EXPECT_TRUE(valid.ok()) << "W=" << W << " step " << s << " " << peer << ": " << valid;
    out.push_back({d.vit.max / d.vit.lower_bound, d.llm.max / d.llm.lower_bound,
                   d.inter_node_bytes + d.remote_load_bytes});
  }
  return out;
}

// The issue of this test: at W = 64 and 256, 0.26, 1 and 16 MP, each of
// three drawn steps.
TEST(PostBalancingPeersTest, TuttiIsNoSlowerThanAnyPeerOnEitherPhaseStepByStep) {
  constexpr uint64_t kSteps = 3;
  for (uint32_t W : {64u, 256u}) {
    for (uint64_t px : {262144ull, 1003520ull, 16777216ull}) {
      const std::vector<StepFigures> tutti = PlanSteps(W, px, "", kSteps);
      ASSERT_EQ(tutti.size(), kSteps);
      for (const char* peer : {"lpt", "kk", "multipack"}) {
        const std::vector<StepFigures> other = PlanSteps(W, px, peer, kSteps);
        ASSERT_EQ(other.size(), kSteps);
        uint64_t own_bytes = 0, peer_bytes = 0;
        for (uint64_t s = 0; s < kSteps; ++s) {
          const std::string at = absl::StrCat("W=", W, " max_pixels ", px, " step ", s, " vs ",
                                              peer, ": ViT ", tutti[s].vit, " vs ", other[s].vit,
                                              ", LLM ", tutti[s].llm, " vs ", other[s].llm);
          EXPECT_LE(tutti[s].vit, other[s].vit + kSlack) << at;
          EXPECT_LE(tutti[s].llm, other[s].llm + kSlack) << at;
          own_bytes += tutti[s].bytes;
          peer_bytes += other[s].bytes;
        }
        EXPECT_LT(own_bytes, peer_bytes) << "W=" << W << " max_pixels " << px << " vs " << peer;
      }
    }
  }
}

// Where a node does not stage every shard, balance is still bought with the
// fewest bytes, and no input is loaded where its shard is not staged (the
// plan check).
TEST(PostBalancingPeersTest, RestrictedStagingKeepsTheBalance) {
  constexpr uint32_t W = 64;
  const ShardsOnNodes staging(SeedIndex()->num_shards(), W / 8, 2);
  const std::vector<StepFigures> tutti = PlanSteps(W, 1003520, "", 2, -1, &staging);
  const std::vector<StepFigures> kk = PlanSteps(W, 1003520, "kk", 2, -1, &staging);
  ASSERT_EQ(tutti.size(), 2u);
  ASSERT_EQ(kk.size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    EXPECT_LE(tutti[s].vit, kk[s].vit + kSlack) << "step " << s;
    EXPECT_LE(tutti[s].llm, kk[s].llm + kSlack) << "step " << s;
    EXPECT_LT(tutti[s].bytes, kk[s].bytes) << "step " << s;
  }
}

// post_balancing.balance_tolerance chooses a point between balance and
// inter-node bytes: a larger tolerance moves no more bytes, and every phase
// stays within (1 + tolerance) x its lower bound.
TEST(PostBalancingPeersTest, TheToleranceTradesBalanceForBytes) {
  constexpr uint32_t W = 64;
  constexpr uint64_t kSteps = 3;
  uint64_t last = ~uint64_t{0};
  for (double t : {0.0, 0.0001, 0.001, 0.01}) {
    const std::vector<StepFigures> f = PlanSteps(W, 262144, "", kSteps, t);
    ASSERT_EQ(f.size(), kSteps);
    uint64_t bytes = 0;
    for (uint64_t s = 0; s < kSteps; ++s) {
      EXPECT_LE(f[s].vit, 1 + std::max(t, kSlack) + 1e-9) << "tolerance " << t << " step " << s;
      EXPECT_LE(f[s].llm, 1 + std::max(t, kSlack) + 1e-9) << "tolerance " << t << " step " << s;
      bytes += f[s].bytes;
    }
    EXPECT_LE(bytes, last) << "tolerance " << t;
    last = bytes;
  }
}

}  // namespace
}  // namespace tutti::packer
