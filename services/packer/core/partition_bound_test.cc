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

// n (cost, size) items, costs uniform in [min_cost, 3), sizes in
// [min_size, 1); the costs also into *costs.
std::vector<std::pair<double, double>> RandomItems2D(size_t n, double min_cost, double min_size,
                                                     std::mt19937_64* rng,
                                                     std::vector<double>* costs) {
  std::vector<std::pair<double, double>> items(n);
  costs->clear();
  for (auto& [cost, size] : items) {
    cost = std::uniform_real_distribution<double>(min_cost, 3.0)(*rng);
    size = std::uniform_real_distribution<double>(min_size, 1.0)(*rng);
    costs->push_back(cost);
  }
  return items;
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

// Random (cost, size) instances on 2 to 1 + rank_kinds ranks, n items from
// min_n up: the bound is never above the best assignment that fits nor
// below the costs' own bound. The room is 1, or with room_slack > 0 the
// mean size per rank times room_slack. Counts the instances something fits
// and those where the bound is over 1% above the costs' own.
struct Trials {
  int feasible = 0, tighter = 0;
};
Trials AgainstBestAssignment(uint64_t seed, int trials, uint32_t rank_kinds, size_t min_n,
                             double min_cost, double min_size, double room_slack) {
  std::mt19937_64 rng(seed);
  Trials t;
  for (int trial = 0; trial < trials; ++trial) {
    const uint32_t ranks = 2 + trial % rank_kinds;
    const size_t n = min_n + rng() % 5 + (rank_kinds > 2 ? rng() % 2 : 0);
    std::vector<double> costs;
    const auto items = RandomItems2D(n, min_cost, min_size, &rng, &costs);
    double total_size = 0, total_cost = 0;
    for (const auto& [cost, size] : items) total_size += size, total_cost += cost;
    const double room = room_slack > 0 ? total_size / ranks * room_slack : 1.0;
    const double opt = BruteForceMakespan2D(items, ranks, room);
    if (opt >= total_cost) continue;  // nothing fits the room
    ++t.feasible;
    const double bound = PartitionLowerBound(items, ranks, room, opt);
    EXPECT_LE(bound, opt * (1 + 1e-9)) << "seed " << seed << " trial " << trial;
    const double alone = PartitionLowerBound(costs, ranks, opt);
    EXPECT_GE(bound, alone * (1 - 1e-12)) << "seed " << seed << " trial " << trial;
    if (bound > alone * 1.01) ++t.tighter;
  }
  return t;
}

// With sizes that share a room per rank: above the costs' own bound where
// the room binds (samples whose tokens fill the VL sequences).
TEST(PartitionBoundTest, SizesSharingARoomTightenTheBound) {
  const Trials t = AgainstBestAssignment(5, 200, 2, 5, 0.2, 0.1, 1.1);
  EXPECT_GT(t.feasible, 100);
  EXPECT_GT(t.tighter, 10);
}

// Rooms that items larger than half of them bind.
TEST(PartitionBoundTest, LargeItemsAgainstTheBestAssignment) {
  const Trials t = AgainstBestAssignment(11, 300, 3, 4, 0.1, 0.05, 0);
  EXPECT_GT(t.feasible, 80);
  EXPECT_GT(t.tighter, 20);
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
