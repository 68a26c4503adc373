#include "services/packer/core/post_balancing/llm_ilp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>

namespace tutti::dispatch {
namespace {

// A small rearrangement instance: `nodes` x `per_node` ranks, one text and
// one VL sequence each (micro-batches of 2 text sequences when padded),
// docs with affinity to one or two random nodes (VL: encoder outputs split
// over nodes; some text docs: token ids on a node that stages their shard).
LlmProblem SmallInstance(uint32_t seed, bool padded, uint32_t nodes = 2, uint32_t per_node = 2) {
  LlmProblem p;
  p.cluster = {nodes * per_node, per_node};
  p.slots.seq_len = 1000;
  p.slots.text_micro_batches = 1;
  p.slots.text_micro_batch = padded ? 2 : 1;
  p.slots.vl_micro_batches = 1;
  p.slots.vl_micro_batch = 1;
  p.padded = padded;
  std::mt19937 rng(seed);
  const uint32_t W = p.cluster.world_size;
  const uint64_t room_text = uint64_t{W} * p.slots.text_sequences() * 1000;
  const uint64_t room_vl = uint64_t{W} * p.slots.vl_sequences() * 1000;
  uint64_t text = 0, vl = 0;
  while (true) {
    const bool is_vl = rng() % 3 == 0;
    const uint32_t t = 40 + rng() % 360;
    uint64_t& have = is_vl ? vl : text;
    if (have + t > 0.75 * (is_vl ? room_vl : room_text)) break;
    have += t;
    p.docs.push_back({t, is_vl});
    std::vector<NodeAffinity::Entry> e;
    uint64_t base = 0;
    if (is_vl) {
      base = uint64_t{t} * 64;
      const uint32_t n1 = rng() % nodes;
      const uint64_t part = base * (1 + rng() % 3) / 3;
      e.push_back({n1, part});
      if (part < base) e.push_back({static_cast<uint32_t>(rng() % nodes), base - part});
    } else if (rng() % 4 == 0) {
      base = uint64_t{t} * 4;
      e.push_back({static_cast<uint32_t>(rng() % nodes), base});
    }
    p.affinity.AddDoc(base, &e);
  }
  return p;
}

struct Gap {
  uint64_t fast = 0, optimum = 0;
};

TEST(LlmIlpTest, OptimumIsFeasibleAndNoWorseThanFast) {
  std::vector<double> gaps;
  for (bool padded : {false, true}) {
    for (uint32_t seed = 1; seed <= 12; ++seed) {
      LlmProblem p = SmallInstance(seed, padded);
      p.bound = 1.02 * LlmLowerBound(p);
      auto fast = RearrangeLlm(p, 4, 0.02);
      ASSERT_TRUE(fast.ok()) << fast.status();
      p.bound = fast->bound;  // the same constraint for both
      IlpOptions o;
      o.time_limit_s = 3;
      o.start = &fast->assignment;
      auto ilp = SolveLlmIlp(p, o);
      ASSERT_TRUE(ilp.ok()) << ilp.status();
      if (ilp->outcome != IlpOutcome::kOptimal) continue;
      EXPECT_TRUE(CheckLlmAssignment(p, ilp->assignment, true).ok())
          << CheckLlmAssignment(p, ilp->assignment, true);
      const uint64_t fb = LlmInterNodeBytes(p, fast->assignment);
      EXPECT_LE(ilp->bytes, fb) << "seed " << seed << " padded " << padded;
      EXPECT_EQ(ilp->bytes, LlmInterNodeBytes(p, ilp->assignment));
      gaps.push_back(ilp->bytes > 0 ? double(fb - ilp->bytes) / ilp->bytes : (fb > 0 ? 1.0 : 0.0));
    }
  }
  ASSERT_GE(gaps.size(), 16u) << "GLPK finished too few instances";
  double sum = 0, worst = 0;
  size_t exact = 0;
  for (double g : gaps) sum += g, worst = std::max(worst, g), exact += g == 0;
  std::printf("fast vs GLPK on %zu instances: %zu optimal, mean gap %.4f, worst %.4f\n",
              gaps.size(), exact, sum / gaps.size(), worst);
  // Tolerance: mean gap within 3%, and at least 80% of instances optimal.
  EXPECT_LE(sum / gaps.size(), 0.03);
  EXPECT_GE(exact * 5, gaps.size() * 4);
}

TEST(LlmIlpTest, ProvesInfeasibility) {
  LlmProblem p = SmallInstance(3, false);
  p.bound = 0.5 * LlmLowerBound(p);
  auto ilp = SolveLlmIlp(p, IlpOptions{});
  ASSERT_TRUE(ilp.ok());
  EXPECT_EQ(ilp->outcome, IlpOutcome::kInfeasible);
}

TEST(LlmIlpTest, ReportsNoResultWhenOutOfTime) {
  LlmProblem p = SmallInstance(4, false, 3, 4);
  p.bound = 1.005 * LlmLowerBound(p);
  IlpOptions o;
  o.time_limit_s = 1e-4;
  auto ilp = SolveLlmIlp(p, o);
  ASSERT_TRUE(ilp.ok());
  EXPECT_EQ(ilp->outcome, IlpOutcome::kNoResult);
  EXPECT_FALSE(ilp->detail.empty());
}

TEST(LlmIlpTest, RefusesHugeInstances) {
  LlmProblem p = SmallInstance(5, false);
  IlpOptions o;
  o.max_binaries = 10;
  auto ilp = SolveLlmIlp(p, o);
  EXPECT_EQ(ilp.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tutti::dispatch
