#include "services/packer/core/rank_heap.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::packer {
namespace {

// The first rank by (key, rank) for which take(rank) holds, or -1.
template <typename Take>
int64_t FirstByScan(const std::vector<double>& keys, Take take) {
  std::vector<std::pair<double, uint32_t>> order;
  for (uint32_t r = 0; r < keys.size(); ++r) order.emplace_back(keys[r], r);
  std::sort(order.begin(), order.end());
  for (const auto& [key, r] : order) {
    if (take(r)) return r;
  }
  return -1;
}

// FirstWhere visits ranks best first, whether its frontier stays small or
// outgrows the array it starts in; Update keeps the order as keys change;
// Smallest lists the least ones in order. Ties (equal keys) go to the
// lower rank.
TEST(RankHeapTest, VisitsRanksInKeyOrderAsKeysChange) {
  std::mt19937_64 rng(7);
  for (const uint32_t n : {1u, 2u, 3u, 17u, 64u, 300u}) {
    std::vector<double> keys(n);
    // Few distinct keys, so that ties are common.
    for (double& k : keys) k = static_cast<double>(rng() % 13);
    RankHeap heap;
    heap.Init(n, keys.data());
    for (int round = 0; round < 200; ++round) {
      // Ranks that take: every rank, one random rank, ranks above a random
      // one (a long walk), none.
      const uint32_t pick = static_cast<uint32_t>(rng() % n);
      const int mode = round % 4;
      auto take = [&](uint32_t r) {
        return mode == 0 || (mode == 1 && r == pick) || (mode == 2 && r >= pick);
      };
      uint32_t visited = 0;
      const int64_t got = heap.FirstWhere([&](uint32_t r) {
        ++visited;
        return take(r);
      });
      ASSERT_EQ(got, FirstByScan(keys, take)) << "n " << n << " round " << round;
      ASSERT_LE(visited, n);
      uint32_t least[16];
      const uint32_t k = heap.Smallest(std::min(n, 5u), least);
      ASSERT_EQ(k, std::min(n, 5u));
      for (uint32_t j = 0; j < k; ++j) {
        const uint32_t r = least[j];
        ASSERT_EQ(
            FirstByScan(keys,
                        [&](uint32_t x) { return std::find(least, least + j, x) == least + j; }),
            r);
      }
      ASSERT_EQ(heap.Top(),
                static_cast<uint32_t>(FirstByScan(keys, [](uint32_t) { return true; })));
      const uint32_t r = static_cast<uint32_t>(rng() % n);
      keys[r] = static_cast<double>(rng() % 13);
      heap.Update(r);
    }
  }
}

}  // namespace
}  // namespace tutti::packer
