#include "services/packer/core/partition_bound.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::packer {
namespace {

// The optimal makespan by trying every assignment (small instances only).
double BruteForceMakespan(const std::vector<double>& items, uint32_t ranks) {
  const size_t n = items.size();
  double best = std::accumulate(items.begin(), items.end(), 0.0);
  std::vector<uint32_t> to(n, 0);
  std::vector<double> load(ranks, 0.0);
  while (true) {
    std::fill(load.begin(), load.end(), 0.0);
    for (size_t i = 0; i < n; ++i) load[to[i]] += items[i];
    best = std::min(best, *std::max_element(load.begin(), load.end()));
    size_t i = 0;
    while (i < n && ++to[i] == ranks) to[i++] = 0;
    if (i == n) break;
  }
  return best;
}

// The same with sizes: the least makespan of the assignments whose ranks
// each hold at most `room` of size (the sum of the costs when none does).
double BruteForceMakespan2D(const std::vector<std::pair<double, double>>& items, uint32_t ranks,
                            double room) {
  const size_t n = items.size();
  double best = 0;
  for (const auto& [cost, size] : items) best += cost;
  std::vector<uint32_t> to(n, 0);
  std::vector<double> load(ranks), used(ranks);
  while (true) {
    std::fill(load.begin(), load.end(), 0.0);
    std::fill(used.begin(), used.end(), 0.0);
    for (size_t i = 0; i < n; ++i) load[to[i]] += items[i].first, used[to[i]] += items[i].second;
    if (*std::max_element(used.begin(), used.end()) <= room) {
      best = std::min(best, *std::max_element(load.begin(), load.end()));
    }
    size_t i = 0;
    while (i < n && ++to[i] == ranks) to[i++] = 0;
    if (i == n) break;
  }
  return best;
}

double Simple(const std::vector<double>& items, uint32_t ranks) {
  return std::max(std::accumulate(items.begin(), items.end(), 0.0) / ranks,
                  *std::max_element(items.begin(), items.end()));
}

// Never above what the best partition reaches, never below max(mean,
// largest), on random instances with few sizes (where it is tight) and
// with continuous sizes.
TEST(PartitionBoundTest, IsAValidBoundAtLeastTheSimpleOne) {
  std::mt19937_64 rng(11);
  int tighter = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t ranks = 2 + trial % 3;
    const size_t n = 4 + rng() % (ranks == 4 ? 5 : 7);
    std::vector<double> items(n);
    for (double& w : items) {
      w = trial % 2 ? 1.0 + rng() % 4 + 0.01 * (rng() % 5)
                    : std::uniform_real_distribution<double>(0.1, 3.0)(rng);
    }
    const double opt = BruteForceMakespan(items, ranks);
    const double bound = PartitionLowerBound(items, ranks, opt);
    EXPECT_LE(bound, opt * (1 + 1e-9)) << "trial " << trial;
    EXPECT_GE(bound, Simple(items, ranks) * (1 - 1e-12)) << "trial " << trial;
    if (bound > Simple(items, ranks) * 1.01) ++tighter;
  }
  EXPECT_GT(tighter, 50);
}

// With sizes that share a room per rank: never above the best assignment
// that fits, never below the costs' own bound, and above it where the room
// binds (samples whose tokens fill the VL sequences).
TEST(PartitionBoundTest, SizesSharingARoomTightenTheBound) {
  std::mt19937_64 rng(5);
  int tighter = 0, feasible = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const uint32_t ranks = 2 + trial % 2;
    const size_t n = 5 + rng() % 5;
    std::vector<std::pair<double, double>> items(n);
    std::vector<double> costs;
    double total_size = 0;
    for (auto& [cost, size] : items) {
      cost = std::uniform_real_distribution<double>(0.2, 3.0)(rng);
      size = std::uniform_real_distribution<double>(0.1, 1.0)(rng);
      total_size += size;
      costs.push_back(cost);
    }
    const double room = total_size / ranks * 1.1;
    const double opt = BruteForceMakespan2D(items, ranks, room);
    double total_cost = 0;
    for (double c : costs) total_cost += c;
    if (opt >= total_cost) continue;  // nothing fits the room
    ++feasible;
    const double bound = PartitionLowerBound(items, ranks, room, opt);
    EXPECT_LE(bound, opt * (1 + 1e-9)) << "trial " << trial;
    const double alone = PartitionLowerBound(costs, ranks, opt);
    EXPECT_GE(bound, alone * (1 - 1e-12)) << "trial " << trial;
    if (bound > alone * 1.01) ++tighter;
  }
  EXPECT_GT(feasible, 100);
  EXPECT_GT(tighter, 10);
}

// Rooms that items larger than half of them bind: still never above the
// best assignment that fits, and above the costs' own bound where they do.
TEST(PartitionBoundTest, LargeItemsAgainstTheBestAssignment) {
  std::mt19937_64 rng(11);
  int tighter = 0, feasible = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t ranks = 2 + trial % 3;
    const size_t n = 4 + rng() % 6;
    std::vector<std::pair<double, double>> items(n);
    std::vector<double> costs;
    double total_cost = 0;
    for (auto& [cost, size] : items) {
      cost = std::uniform_real_distribution<double>(0.1, 3.0)(rng);
      size = std::uniform_real_distribution<double>(0.05, 1.0)(rng);
      costs.push_back(cost);
      total_cost += cost;
    }
    const double room = 1.0;
    const double opt = BruteForceMakespan2D(items, ranks, room);
    if (opt >= total_cost) continue;  // nothing fits the room
    ++feasible;
    const double bound = PartitionLowerBound(items, ranks, room, opt);
    EXPECT_LE(bound, opt * (1 + 1e-9)) << "trial " << trial;
    if (bound > PartitionLowerBound(costs, ranks, opt) * 1.01) ++tighter;
  }
  EXPECT_GT(feasible, 80);
  EXPECT_GT(tighter, 20);
}

// Equal items: some rank holds ceil(n / W) of them.
TEST(PartitionBoundTest, EqualItemsNeedTheRoundedUpCount) {
  const std::vector<double> items(41, 1.0);
  EXPECT_DOUBLE_EQ(PartitionLowerBound(items, 4, 20.0), 11.0);
  EXPECT_TRUE(ProvablyOverfull({1.0, 1.0, 1.0}, 2, 1.9));
  EXPECT_FALSE(ProvablyOverfull({1.0, 1.0, 1.0}, 2, 2.0));
}

// One item of 1.0 and six of 0.34 on two ranks: the best is 1.68 (1.0 +
// 2 x 0.34 beside 4 x 0.34); the mean (1.52), the largest item and the
// pigeonhole sums (at most 1.36) stay below 1.6, which the dual feasible
// function u_4 proves impossible (0.75 + 6 x 0.25 > 2).
TEST(PartitionBoundTest, DualFeasibleFunctionsSeeMixedSizes) {
  std::vector<double> items(6, 0.34);
  items.push_back(1.0);
  EXPECT_TRUE(ProvablyOverfull({1.0, 0.34, 0.34, 0.34, 0.34, 0.34, 0.34}, 2, 1.6));
  const double bound = PartitionLowerBound(items, 2, 1.68);
  EXPECT_GT(bound, 1.6);
  EXPECT_LE(bound, 1.68);
}

// A sample whose tokens fill its rank's room holds that rank alone: on two
// ranks, (1, 10) and four of (5, 1) with room 10 need 20 on one rank,
// where the mean is 10.5.
TEST(PartitionBoundTest, AnItemFillingItsRoomHoldsItsRankAlone) {
  std::vector<std::pair<double, double>> items(4, {5.0, 1.0});
  items.emplace_back(1.0, 10.0);
  EXPECT_NEAR(PartitionLowerBound(items, 2, 10.0, 20.0), 20.0, 1e-6);
  // A large item leaving room for one small one: (1, 9) + (5, 1) beside
  // three of (5, 1): 15.
  items.back() = {1.0, 9.0};
  EXPECT_NEAR(PartitionLowerBound(items, 2, 10.0, 20.0), 15.0, 1e-6);
  // More large items than ranks: nothing fits, the bound is the known plan.
  std::vector<std::pair<double, double>> three(3, {1.0, 6.0});
  EXPECT_EQ(PartitionLowerBound(three, 2, 10.0, 7.0), 7.0);
}

TEST(PartitionBoundTest, EmptyOrNoRanks) {
  EXPECT_EQ(PartitionLowerBound({}, 4, 1.0), 0.0);
  EXPECT_EQ(PartitionLowerBound({1.0}, 0, 1.0), 0.0);
  EXPECT_FALSE(ProvablyOverfull({}, 4, 1.0));
}

}  // namespace
}  // namespace tutti::packer
