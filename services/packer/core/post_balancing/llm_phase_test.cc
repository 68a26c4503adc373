#include "services/packer/core/post_balancing/llm_phase.h"

#include <gtest/gtest.h>

#include <random>

namespace tutti::dispatch {
namespace {

// Text and VL docs with lognormal-ish lengths filling ~80% of the room;
// VL docs pinned (affinity) to a random node with their embedding bytes.
LlmProblem RandomProblem(uint32_t world, uint32_t per_node, bool padded, uint32_t seed,
                         bool with_affinity = true) {
  LlmProblem p;
  p.cluster = {world, per_node};
  p.slots.seq_len = 4096;
  p.slots.text_micro_batches = 2;
  p.slots.text_micro_batch = padded ? 2 : 1;
  p.slots.vl_micro_batches = 1;
  p.slots.vl_micro_batch = 1;
  p.padded = padded;
  std::mt19937 rng(seed);
  std::lognormal_distribution<double> len(std::log(300.0), 0.9);
  const uint64_t room_text = uint64_t{world} * p.slots.text_sequences() * p.slots.seq_len;
  const uint64_t room_vl = uint64_t{world} * p.slots.vl_sequences() * p.slots.seq_len;
  uint64_t text = 0, vl = 0;
  while (text < 0.8 * room_text || vl < 0.8 * room_vl) {
    const bool is_vl = vl < 0.8 * room_vl && (text >= 0.8 * room_text || rng() % 4 == 0);
    const uint32_t t = std::min<uint32_t>(4096, 1 + static_cast<uint32_t>(len(rng)));
    p.docs.push_back({t, is_vl});
    (is_vl ? vl : text) += t;
    if (with_affinity) {
      std::vector<NodeAffinity::Entry> e;
      if (is_vl) e.push_back({static_cast<uint32_t>(rng() % p.cluster.nodes()), uint64_t{t} * 100});
      p.affinity.AddDoc(is_vl ? uint64_t{t} * 100 : 0, &e);
    }
  }
  return p;
}

double Max(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

TEST(NodeAffinityTest, BytesPerNode) {
  NodeAffinity a;
  std::vector<NodeAffinity::Entry> e = {{2, 30}, {0, 50}, {2, 20}, {1, 0}};
  a.AddDoc(100, &e);
  std::vector<NodeAffinity::Entry> none;
  a.AddDoc(0, &none);
  EXPECT_EQ(a.Bytes(0, 0), 50u);
  EXPECT_EQ(a.Bytes(0, 2), 50u);  // 30 + 20 merged
  EXPECT_EQ(a.Bytes(0, 1), 100u);
  EXPECT_EQ(a.Bytes(0, 3), 100u);
  EXPECT_EQ(a.Bytes(1, 0), 0u);
  EXPECT_EQ(a.end(0) - a.begin(0), 2);
}

TEST(LlmPhaseTest, BalancedPlacementIsFeasibleAndTight) {
  for (bool padded : {false, true}) {
    LlmProblem p = RandomProblem(16, 4, padded, padded ? 11 : 12, false);
    auto a = BalanceLlm(p, 4);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(CheckLlmAssignment(p, *a, false).ok());
    const double lb = LlmLowerBound(p);
    const double peak = Max(LlmRankCosts(p, *a));
    EXPECT_GE(peak, lb * (1 - 1e-9));
    EXPECT_LE(peak, (padded ? 1.15 : 1.02) * lb) << "padded " << padded;
  }
}

// With a target below the bound, the rearrangement buys balance back:
// unpadded, it ends no slower than the node-oblivious balancer (within 0.01%
// of the bound), and moves far fewer bytes than the balancer's placement.
TEST(LlmPhaseTest, ATargetBuysBalanceBackWithFewBytes) {
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    LlmProblem p = RandomProblem(32, 8, false, seed);
    const double lb = LlmLowerBound(p);
    p.bound = 1.01 * lb;
    auto loose = RearrangeLlm(p, 4, 0.01);
    auto tight = RearrangeLlm(p, 4, 0.01, nullptr, (1 + 1e-4) * lb);
    auto balanced = BalanceLlm(p, 4);
    ASSERT_TRUE(loose.ok() && tight.ok() && balanced.ok());
    EXPECT_TRUE(CheckLlmAssignment(p, tight->assignment, true).ok());
    const double peak = Max(LlmRankCosts(p, tight->assignment));
    EXPECT_LE(peak, Max(LlmRankCosts(p, loose->assignment)) * (1 + 1e-12)) << "seed " << seed;
    EXPECT_LE(peak, std::max((1 + 1e-4) * lb, Max(LlmRankCosts(p, *balanced)) + 1e-4 * lb))
        << "seed " << seed;
    const uint64_t bytes = LlmInterNodeBytes(p, tight->assignment);
    EXPECT_LT(bytes, LlmInterNodeBytes(p, *balanced) / 2) << "seed " << seed;
  }
}

TEST(LlmPhaseTest, RearrangementKeepsBoundAndCutsBytes) {
  for (bool padded : {false, true}) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      LlmProblem p = RandomProblem(32, 8, padded, seed);
      auto balanced = BalanceLlm(p, 4);
      ASSERT_TRUE(balanced.ok());
      p.bound = 1.01 * LlmLowerBound(p);
      auto r = RearrangeLlm(p, 4, 0.01, &*balanced);
      ASSERT_TRUE(r.ok()) << r.status();
      LlmProblem checked = p;
      checked.bound = r->bound;
      EXPECT_TRUE(CheckLlmAssignment(checked, r->assignment, true).ok());
      EXPECT_GE(r->bound, p.bound);
      const uint64_t fast = LlmInterNodeBytes(p, r->assignment);
      const uint64_t oblivious = LlmInterNodeBytes(p, *balanced);
      EXPECT_LE(fast, oblivious / 10) << "padded " << padded << " seed " << seed;
    }
  }
}

TEST(LlmPhaseTest, ImpossibleBoundFallsBackToBalanced) {
  LlmProblem p = RandomProblem(8, 4, false, 5);
  p.bound = 0.5 * LlmLowerBound(p);  // nobody can meet it
  auto r = RearrangeLlm(p, 4, 0.01);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->fell_back);
  EXPECT_GT(r->bound, p.bound);
  LlmProblem checked = p;
  checked.bound = r->bound;
  EXPECT_TRUE(CheckLlmAssignment(checked, r->assignment, true).ok());
}

TEST(LlmPhaseTest, TooManyTokensIsResourceExhausted) {
  LlmProblem p;
  p.cluster = {2, 1};
  p.slots.seq_len = 100;
  for (int i = 0; i < 5; ++i) p.docs.push_back({60, false});  // 5 x 60 into 4 x 100
  auto a = BalanceLlm(p, 4);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(a.status().message().find("do not fit"), std::string::npos);
}

TEST(LlmPhaseTest, PacksWhenLptCannot) {
  // 6,5,4,3,2 into two sequences of 10: LPT leaves 1 token free in each
  // before the 2; best-fit decreasing packs {6,4} and {5,3,2}.
  LlmProblem p;
  p.cluster = {2, 1};
  p.slots.seq_len = 10;
  p.slots.vl_micro_batches = 0;
  for (uint32_t t : {6u, 5u, 4u, 3u, 2u}) p.docs.push_back({t, false});
  auto a = BalanceLlm(p, 4);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(CheckLlmAssignment(p, *a, false).ok());
}

TEST(LlmPhaseTest, CheckCatchesViolations) {
  LlmProblem p;
  p.cluster = {2, 1};
  p.slots.seq_len = 100;
  p.docs = {{60, false}, {60, true}};
  LlmAssignment a{{0, 1}, {0, 1}};
  EXPECT_TRUE(CheckLlmAssignment(p, a, false).ok());
  LlmAssignment wrong_modality{{0, 1}, {1, 1}};
  EXPECT_FALSE(CheckLlmAssignment(p, wrong_modality, false).ok());
  p.docs = {{60, false}, {60, false}};
  LlmAssignment overfull{{0, 0}, {0, 0}};
  EXPECT_FALSE(CheckLlmAssignment(p, overfull, false).ok());
  p.bound = 10;
  EXPECT_FALSE(CheckLlmAssignment(p, LlmAssignment{{0, 1}, {0, 0}}, true).ok());
}

TEST(LlmPhaseTest, Deterministic) {
  LlmProblem p = RandomProblem(16, 4, false, 9);
  p.bound = 1.01 * LlmLowerBound(p);
  auto a = RearrangeLlm(p, 4, 0.01);
  auto b = RearrangeLlm(p, 4, 0.01);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->assignment.rank, b->assignment.rank);
  EXPECT_EQ(a->assignment.seq, b->assignment.seq);
}

}  // namespace
}  // namespace tutti::dispatch
