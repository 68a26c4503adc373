#include "services/packer/core/post_balancing/balance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace tutti::dispatch {
namespace {

std::vector<double> RandomCosts(uint32_t n, uint32_t seed, double tail = 0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(1.0, 100.0);
  std::vector<double> c(n);
  for (double& x : c) x = u(rng) + (u(rng) < 1 + tail * 99 ? 1000.0 : 0.0);
  return c;
}

TEST(BalanceTest, LowerBoundIsMeanOrLargestItem) {
  EXPECT_DOUBLE_EQ(MakespanLowerBound({1, 2, 3, 4}, 2), 5);
  EXPECT_DOUBLE_EQ(MakespanLowerBound({10, 1, 1}, 3), 10);
  EXPECT_DOUBLE_EQ(MakespanLowerBound({}, 4), 0);
}

TEST(BalanceTest, EveryItemPlacedOnAValidBin) {
  for (uint32_t bins : {1u, 2u, 7u, 64u}) {
    const auto costs = RandomCosts(300, bins);
    for (const auto& a : {LptPartition(costs, bins), KarmarkarKarpPartition(costs, bins),
                          BalancePartition(costs, bins, 64, 4)}) {
      ASSERT_EQ(a.size(), costs.size());
      for (uint32_t b : a) EXPECT_LT(b, bins);
    }
  }
}

TEST(BalanceTest, PerfectPartitionFound) {
  // {8,7,6,5,4} into 2 bins: LPT and KK give 17 and 16; the swap search
  // finds the optimum {8,7} / {6,5,4}.
  const std::vector<double> costs = {8, 7, 6, 5, 4};
  EXPECT_DOUBLE_EQ(Makespan(costs, 2, KarmarkarKarpPartition(costs, 2)), 16);
  EXPECT_DOUBLE_EQ(Makespan(costs, 2, BalancePartition(costs, 2, 64, 4)), 15);
  // The classic LPT worst case for 2 bins: {3,3,2,2,2} -> LPT 7, optimum 6.
  const std::vector<double> lpt_bad = {3, 3, 2, 2, 2};
  EXPECT_DOUBLE_EQ(Makespan(lpt_bad, 2, LptPartition(lpt_bad, 2)), 7);
  EXPECT_DOUBLE_EQ(Makespan(lpt_bad, 2, BalancePartition(lpt_bad, 2, 64, 4)), 6);
}

TEST(BalanceTest, ImprovementNeverWorsensAndMeetsLptBound) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const uint32_t bins = 2 + seed % 9;
    const auto costs = RandomCosts(20 + 7 * seed, seed, 0.05);
    auto a = LptPartition(costs, bins);
    const double lpt = Makespan(costs, bins, a);
    const double improved = ImproveMakespan(costs, bins, 4, &a);
    EXPECT_LE(improved, lpt + 1e-9);
    EXPECT_NEAR(improved, Makespan(costs, bins, a), 1e-6);
    // List scheduling: makespan <= mean + largest item.
    double total = 0;
    for (double c : costs) total += c;
    EXPECT_LE(lpt, total / bins + *std::max_element(costs.begin(), costs.end()) + 1e-9);
    EXPECT_GE(improved, MakespanLowerBound(costs, bins) - 1e-9);
  }
}

TEST(BalanceTest, ManySmallItemsBalanceTightly) {
  const auto costs = RandomCosts(20000, 7);
  const auto a = BalancePartition(costs, 256, 64, 4);
  EXPECT_LE(Makespan(costs, 256, a), 1.001 * MakespanLowerBound(costs, 256));
}

TEST(BalanceTest, Deterministic) {
  const auto costs = RandomCosts(500, 3, 0.02);
  EXPECT_EQ(BalancePartition(costs, 16, 64, 4), BalancePartition(costs, 16, 64, 4));
  EXPECT_EQ(KarmarkarKarpPartition(costs, 16), KarmarkarKarpPartition(costs, 16));
}

TEST(BalanceTest, MoreBinsThanItems) {
  const std::vector<double> costs = {5, 3};
  const auto a = BalancePartition(costs, 8, 64, 4);
  EXPECT_NE(a[0], a[1]);
  EXPECT_DOUBLE_EQ(Makespan(costs, 8, a), 5);
}

}  // namespace
}  // namespace tutti::dispatch
