#include "services/packer/core/post_balancing/min_tree.h"

#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace tutti::dispatch {
namespace {

// The smallest unmasked key, lowest index on ties; kNone when all are masked.
uint32_t BruteMin(const std::vector<double>& keys, const std::vector<bool>& masked) {
  uint32_t best = MinTree::kNone;
  for (uint32_t i = 0; i < keys.size(); ++i) {
    if (masked[i]) continue;
    if (best == MinTree::kNone || keys[i] < keys[best]) best = i;
  }
  return best;
}

TEST(MinTreeTest, AgreesWithAScanUnderRandomUpdatesAndMasks) {
  std::mt19937_64 rng(5);
  for (uint32_t n : {1u, 2u, 3u, 7u, 64u, 100u, 2560u}) {
    std::vector<double> keys(n);
    std::vector<bool> masked(n, false);
    // Few distinct values, so ties are common.
    std::uniform_int_distribution<int> value(0, 20);
    for (double& k : keys) k = value(rng) * 0.5;
    MinTree tree(&keys);
    ASSERT_EQ(tree.Min(), BruteMin(keys, masked)) << n;
    for (int step = 0; step < 3000; ++step) {
      const uint32_t i = std::uniform_int_distribution<uint32_t>(0, n - 1)(rng);
      if (step % 5 == 0) {
        masked[i] = !masked[i];
        tree.Mask(i, masked[i]);
      } else {
        keys[i] = step % 11 == 0 ? std::numeric_limits<double>::infinity() : value(rng) * 0.5;
        tree.Update(i);
      }
      ASSERT_EQ(tree.Min(), BruteMin(keys, masked)) << "n " << n << " step " << step;
    }
    for (uint32_t i = 0; i < n; ++i) tree.Mask(i, true);
    EXPECT_EQ(tree.Min(), MinTree::kNone);
  }
  std::vector<double> none;
  EXPECT_EQ(MinTree(&none).Min(), MinTree::kNone);
}

TEST(MinTreeTest, LargeKeysKeepTheirOrder) {
  std::vector<double> keys = {1e12, 1e12 + 1e3, 3e11, 3e11 * (1 + 1e-9)};
  MinTree tree(&keys);
  EXPECT_EQ(tree.Min(), 2u);
  keys[2] = 5e12;
  tree.Update(2);
  EXPECT_EQ(tree.Min(), 3u);
}

}  // namespace
}  // namespace tutti::dispatch
