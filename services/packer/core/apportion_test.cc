#include "services/packer/core/apportion.h"

#include <cstdint>
#include <vector>

#include "common/rng.h"
#include "gtest/gtest.h"

namespace tutti::packer {
namespace {

using u128 = unsigned __int128;

// Checks both bounds in exact arithmetic over `steps` steps, walking the
// steps in order: every count within one sample of N w / U (in {floor,
// ceil}), the counts summing to N, and every cumulative count since the
// segment began strictly within one sample of its target (equal to it when
// the target is whole). `before` must match the running sums.
void CheckBounds(const Apportionment& a, const std::vector<ApportionSegment>& segs,
                 uint64_t steps) {
  const uint32_t S = a.sources(), N = a.per_step();
  std::vector<uint32_t> count(S);
  std::vector<uint64_t> before(S), running(S, 0), at_start(S, 0);
  size_t seg = 0;
  uint64_t since = 0;
  u128 U = 0;
  auto enter = [&](size_t k) {
    seg = k;
    since = 0;
    U = 0;
    for (uint64_t w : segs[k].weights) U += w;
    at_start = running;
  };
  enter(0);
  for (uint64_t t = 0; t < steps; ++t) {
    if (seg + 1 < segs.size() && segs[seg + 1].start_step == t) enter(seg + 1);
    a.At(t, count.data(), before.data());
    uint64_t sum = 0;
    for (uint32_t s = 0; s < S; ++s) {
      ASSERT_EQ(before[s], running[s]) << "step " << t << " source " << s;
      const u128 share = u128{N} * segs[seg].weights[s];  // a_s x U
      const u128 c = u128{count[s]} * U;
      // floor(a) <= c <= ceil(a), i.e. |c - a| < 1.
      ASSERT_TRUE(c + U > share && c < share + U) << "step " << t << " source " << s;
      sum += count[s];
      running[s] += count[s];
      // Cumulative since the segment began: |C - a (since + 1)| < 1.
      const u128 got = u128{running[s] - at_start[s]} * U;
      const u128 want = share * (since + 1);
      ASSERT_TRUE(got + U > want && got < want + U)
          << "step " << t << " source " << s << " cumulative " << running[s] - at_start[s];
    }
    ASSERT_EQ(sum, N) << "step " << t;
    ++since;
  }
}

std::vector<uint64_t> RandomWeights(Rng& rng, uint32_t S) {
  std::vector<uint64_t> w(S);
  uint64_t total = 0;
  const uint64_t range = rng.Bernoulli(0.5) ? 10 : 1000000;
  for (uint64_t& x : w) total += x = rng.Below(range);
  if (total == 0) w[0] = 1;
  // Some near-zero and near-whole shares, as extreme weights give.
  if (S > 2 && rng.Bernoulli(0.3)) w[1] = 1;
  return w;
}

TEST(ApportionTest, RandomStaticWeightsKeepBothBounds) {
  Rng rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t S = static_cast<uint32_t>(rng.Between(2, 24));
    const uint32_t N = static_cast<uint32_t>(rng.Between(S, 200));
    std::vector<ApportionSegment> segs = {{0, RandomWeights(rng, S)}};
    Apportionment a(N, S, segs);
    CheckBounds(a, segs, 600);
  }
}

TEST(ApportionTest, HeavyAndLightExtremes) {
  // Rates just under 1 and just above 0 (PD^2's group deadlines decide
  // ties among the heavy ones).
  for (uint32_t N : {7u, 50u, 97u}) {
    std::vector<uint64_t> w = {55, 55, 55, 55, 1, 1, 2, 5, 60, 55, 9, 1};
    std::vector<ApportionSegment> segs = {{0, w}};
    Apportionment a(N, static_cast<uint32_t>(w.size()), segs);
    CheckBounds(a, segs, 3000);
  }
}

TEST(ApportionTest, SegmentsStartAfresh) {
  Rng rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const uint32_t S = static_cast<uint32_t>(rng.Between(2, 12));
    const uint32_t N = static_cast<uint32_t>(rng.Between(S, 90));
    std::vector<ApportionSegment> segs;
    uint64_t at = 0;
    for (int k = 0; k < 4; ++k) {
      std::vector<uint64_t> w = RandomWeights(rng, S);
      if (k == 2) w[0] = 0;  // a source dropped
      segs.push_back({at, w});
      at += rng.Between(1, 400);
    }
    Apportionment a(N, S, segs);
    CheckBounds(a, segs, at + 300);
  }
}

TEST(ApportionTest, AnyStepDirectlyEqualsTheWalk) {
  // A fresh apportionment asked for far steps (from the period, a
  // checkpoint or the segment's start) agrees with one walked in order.
  std::vector<ApportionSegment> segs = {
      {0, {3, 5, 11, 2}}, {5000, {1000003, 2, 999, 1}}, {12000, {1, 1, 1, 1}}};
  Apportionment walked(37, 4, segs);
  std::vector<std::vector<uint64_t>> before(20000, std::vector<uint64_t>(4));
  std::vector<uint32_t> count(4);
  for (uint64_t t = 0; t < 20000; ++t) walked.At(t, count.data(), before[t].data());
  for (uint64_t t : {19999ull, 0ull, 4999ull, 5000ull, 777ull, 11999ull, 12000ull, 15555ull}) {
    Apportionment fresh(37, 4, segs);
    std::vector<uint64_t> b(4);
    fresh.At(t, count.data(), b.data());
    EXPECT_EQ(b, before[t]) << t;
    for (uint32_t s = 0; s < 4; ++s) EXPECT_EQ(fresh.Before(t, s), before[t][s]);
  }
}

TEST(ApportionTest, StepOfInvertsTheCounts) {
  std::vector<ApportionSegment> segs = {
      {0, {3, 5, 11, 1}}, {300, {0, 5, 1, 1}}, {700, {7, 0, 3, 1}}};
  Apportionment a(23, 4, segs);
  std::vector<uint32_t> count(4);
  std::vector<uint64_t> before(4);
  for (uint64_t t = 0; t < 1200; ++t) {
    a.At(t, count.data(), before.data());
    for (uint32_t s = 0; s < 4; ++s) {
      for (uint64_t q = before[s]; q < before[s] + count[s]; ++q) {
        ASSERT_EQ(a.StepOf(s, q), t) << "source " << s << " sample " << q;
      }
    }
  }
}

TEST(ApportionTest, ExactWeightsReadDecimalsExactly) {
  EXPECT_EQ(ExactWeights({0.3, 0.2, 0.1, 0.4}), (std::vector<uint64_t>{3, 2, 1, 4}));
  EXPECT_EQ(ExactWeights({30, 20, 50}), (std::vector<uint64_t>{3, 2, 5}));
  EXPECT_EQ(ExactWeights({0, 2.5}), (std::vector<uint64_t>{0, 1}));
  // A third is no decimal: fixed point, the ratios within 2^-52.
  const std::vector<uint64_t> w = ExactWeights({1.0 / 3, 2.0 / 3});
  EXPECT_NEAR(static_cast<double>(w[1]) / static_cast<double>(w[0]), 2.0, 1e-12);
}

TEST(ApportionTest, ManySourcesLargeStep) {
  // 200 sources of FineVision-like weights (three orders of magnitude) at a
  // W = 256 step: both bounds over 20,000 steps.
  Rng rng(3);
  std::vector<uint64_t> w(200);
  for (uint64_t& x : w) x = static_cast<uint64_t>(rng.LogUniform(1e3, 1e6));
  std::vector<uint64_t> w2 = w;
  for (size_t i = 0; i < 50; ++i) w2[i] *= 3;
  std::vector<ApportionSegment> segs = {{0, w}, {12000, w2}};
  Apportionment a(256 * 6, 200, segs);
  CheckBounds(a, segs, 20000);
}

}  // namespace
}  // namespace tutti::packer
