#include "services/packer/core/multiway_partition.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "common/rng.h"
#include "gtest/gtest.h"

namespace tutti::packer {
namespace {

std::vector<double> Loads(const std::vector<double>& costs, uint32_t bins,
                          const std::vector<uint32_t>& bin_of) {
  std::vector<double> loads(bins, 0.0);
  for (size_t i = 0; i < costs.size(); ++i) loads[bin_of[i]] += costs[i];
  return loads;
}

double Makespan(const std::vector<double>& costs, uint32_t bins,
                const std::vector<uint32_t>& bin_of) {
  const std::vector<double> loads = Loads(costs, bins, bin_of);
  return *std::max_element(loads.begin(), loads.end());
}

std::vector<double> RandomCosts(uint32_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<double> costs(n);
  for (double& c : costs) c = rng.LogUniform(1, 1000);
  return costs;
}

TEST(MultiwayPartitionTest, DecreasingOrderBreaksTiesByIndex) {
  const std::vector<double> costs = {2, 5, 2, 7, 5};
  EXPECT_EQ(DecreasingOrder(5, [&](uint32_t i) { return costs[i]; }),
            (std::vector<uint32_t>{3, 1, 4, 0, 2}));
}

TEST(MultiwayPartitionTest, LptPlacesOnTheLeastLoadedBinLowerBinOnTies) {
  // 7 -> bin 0; 5 -> bin 1; 4 -> bin 2; 3 -> bin 2 (4 < 5 < 7); 3 -> bin 1.
  const std::vector<double> costs = {3, 7, 4, 5, 3};
  EXPECT_EQ(LptPartition(costs, 3), (std::vector<uint32_t>{2, 0, 2, 1, 1}));
  // The classic worst case for two bins: LPT 7, the optimum 6.
  const std::vector<double> bad = {3, 3, 2, 2, 2};
  EXPECT_DOUBLE_EQ(Makespan(bad, 2, LptPartition(bad, 2)), 7);
}

TEST(MultiwayPartitionTest, LptPlaceSkipsBinsThatDoNotTakeAndReportsTheFirstItemNoneTakes) {
  // Bins start at loads 0 and 1; bin 0 takes at most two items.
  std::vector<double> loads = {0, 1};
  std::vector<uint32_t> count(2, 0), bin_of(4, 9);
  const std::vector<double> costs = {4, 3, 2, 1};
  const int64_t failed = LptPlace(
      {0, 1, 2, 3}, &loads, [&](uint32_t i) { return costs[i]; },
      [&](uint32_t b, uint32_t) { return b == 1 || count[0] < 2; },
      [&](uint32_t b, uint32_t i) {
        ++count[b];
        bin_of[i] = b;
      });
  EXPECT_EQ(failed, -1);
  // 4 -> 0 (0 < 1); 3 -> 1 (1 < 4); 2 -> 0 (4 = 4, lower bin); 1 -> 1 (bin 0 full).
  EXPECT_EQ(bin_of, (std::vector<uint32_t>{0, 1, 0, 1}));
  EXPECT_EQ(loads, (std::vector<double>{6, 5}));
  std::vector<double> none = {0, 0};
  EXPECT_EQ(LptPlace(
                {2, 0, 1}, &none, [&](uint32_t i) { return costs[i]; },
                [&](uint32_t, uint32_t i) { return i != 0; }, [](uint32_t, uint32_t) {}),
            1);
}

TEST(MultiwayPartitionTest, KarmarkarKarpDifferencesAndNumbersPartsHeaviestFirst) {
  // {8,7,6,5,4} in two: 8-7 -> 1, 6-5 -> 1, then 4, 1, 1: {8,6,4|7,5}? KK
  // gives 16 against LPT's 17 and the optimum 15.
  const std::vector<double> costs = {8, 7, 6, 5, 4};
  const std::vector<uint32_t> kk = KarmarkarKarpPartition(costs, 2);
  EXPECT_DOUBLE_EQ(Makespan(costs, 2, kk), 16);
  EXPECT_DOUBLE_EQ(Makespan(costs, 2, LptPartition(costs, 2)), 17);
  const std::vector<double> loads = Loads(costs, 2, kk);
  EXPECT_GE(loads[0], loads[1]);
}

TEST(MultiwayPartitionTest, EveryItemOnAValidBinWithinTheListSchedulingBound) {
  for (uint32_t bins : {1u, 2u, 7u, 64u, 300u}) {
    const std::vector<double> costs = RandomCosts(500, bins);
    const double total = std::accumulate(costs.begin(), costs.end(), 0.0);
    const double largest = *std::max_element(costs.begin(), costs.end());
    for (const auto& bin_of : {LptPartition(costs, bins), KarmarkarKarpPartition(costs, bins),
                               KarmarkarKarpPartition(costs, bins, KkSums::kRebased)}) {
      ASSERT_EQ(bin_of.size(), costs.size());
      for (uint32_t b : bin_of) ASSERT_LT(b, bins);
      EXPECT_LE(Makespan(costs, bins, bin_of), total / bins + largest + 1e-9) << bins;
    }
    // Parts by decreasing sum.
    const std::vector<double> loads = Loads(costs, bins, KarmarkarKarpPartition(costs, bins));
    EXPECT_TRUE(std::is_sorted(loads.begin(), loads.end(), std::greater<double>())) << bins;
  }
}

TEST(MultiwayPartitionTest, KarmarkarKarpBeatsLptOnManyEqualSizedItems) {
  // Few items a bin: differencing pairs large with small items.
  const std::vector<double> costs = RandomCosts(64, 3);
  const double kk = Makespan(costs, 16, KarmarkarKarpPartition(costs, 16));
  const double lpt = Makespan(costs, 16, LptPartition(costs, 16));
  EXPECT_LE(kk, lpt * 1.05);
}

TEST(MultiwayPartitionTest, KarmarkarKarpSumsDifferOnlyWhereTiesRoundApart) {
  // In exact arithmetic the two 0.8 parts tie; in doubles the absolute sums
  // (0.3 + 0.5, 0.3 + 0.1 + 0.4) and the rebased ones round apart, and the
  // tie goes each way.
  const std::vector<double> costs = {0.3, 0.3, 0.1, 0.5, 0.4, 0.9};
  const std::vector<uint32_t> absolute = KarmarkarKarpPartition(costs, 3);
  const std::vector<uint32_t> rebased = KarmarkarKarpPartition(costs, 3, KkSums::kRebased);
  EXPECT_EQ(absolute, (std::vector<uint32_t>{2, 1, 2, 1, 2, 0}));
  EXPECT_EQ(rebased, (std::vector<uint32_t>{1, 2, 1, 2, 1, 0}));
  for (const auto& part_of : {absolute, rebased}) {
    const std::vector<double> loads = Loads(costs, 3, part_of);
    EXPECT_DOUBLE_EQ(loads[0], 0.9);
    EXPECT_NEAR(loads[1], 0.8, 1e-12);
    EXPECT_NEAR(loads[2], 0.8, 1e-12);
  }
  // Whole costs: no rounding, the same partition.
  for (uint64_t seed = 0; seed < 50; ++seed) {
    Rng rng(seed);
    std::vector<double> whole(40 + seed);
    for (double& c : whole) c = static_cast<double>(rng.Between(1, 9));
    const uint32_t bins = 2 + seed % 13;
    EXPECT_EQ(KarmarkarKarpPartition(whole, bins),
              KarmarkarKarpPartition(whole, bins, KkSums::kRebased))
        << seed;
  }
}

TEST(MultiwayPartitionTest, EmptyAndSingleBin) {
  EXPECT_TRUE(LptPartition({}, 4).empty());
  EXPECT_TRUE(KarmarkarKarpPartition({}, 4).empty());
  EXPECT_EQ(KarmarkarKarpPartition({1, 2, 3}, 1), (std::vector<uint32_t>{0, 0, 0}));
  EXPECT_EQ(LptPartition({1, 2, 3}, 1), (std::vector<uint32_t>{0, 0, 0}));
}

}  // namespace
}  // namespace tutti::packer
