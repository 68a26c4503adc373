// The serialized plans the packer keeps (the packer's use of them and its
// per-connection state over rounds of plan streams: packer_test.cc).
#include "services/packer/served_plans.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::packer {
namespace {

ServedPlans::Bytes Bytes(size_t n) { return std::make_shared<const std::string>(n, 'x'); }

TEST(ServedPlansTest, KeysAreSortedWithoutDuplicates) {
  EXPECT_EQ(ServedPlans::Key(std::vector<uint32_t>{3, 1, 3, 2}), (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_TRUE(ServedPlans::Key({}).empty());
}

TEST(ServedPlansTest, TheFirstBytesKeptAreServedAgain) {
  ServedPlans p({.max_bytes = 1000, .keep_behind = 4});
  EXPECT_EQ(p.Find(1, {0}), nullptr);
  auto a = Bytes(10);
  EXPECT_EQ(p.Insert(1, {0}, a), a);
  EXPECT_EQ(p.Insert(1, {0}, Bytes(10)), a);  // built twice at once: one is kept
  EXPECT_EQ(p.Find(1, {0}), a);
  EXPECT_EQ(p.Find(1, {1}), nullptr);
  EXPECT_EQ(p.Find(2, {0}), nullptr);
  EXPECT_EQ(p.bytes(), 10u);
  EXPECT_EQ(p.entries(), 1u);
}

TEST(ServedPlansTest, StepsBehindTheWindowAndBytesOverTheBudgetAreDropped) {
  ServedPlans p({.max_bytes = 100, .keep_behind = 2});
  for (uint64_t s = 0; s < 3; ++s) p.Insert(s, {0}, Bytes(10));
  EXPECT_EQ(p.steps(), 3u);
  p.Insert(5, {0}, Bytes(10));  // steps 0..2 are more than 2 behind 5
  EXPECT_EQ(p.steps(), 1u);
  EXPECT_EQ(p.bytes(), 10u);
  EXPECT_EQ(p.Find(2, {0}), nullptr);
  auto late = Bytes(10);
  EXPECT_EQ(p.Insert(1, {0}, late), late);  // served, not kept
  EXPECT_EQ(p.Find(1, {0}), nullptr);
  // Over the budget: the lowest step goes first, the one being added last.
  for (uint32_t r = 1; r < 5; ++r) p.Insert(4, {r}, Bytes(10));
  EXPECT_EQ(p.bytes(), 50u);
  p.Insert(5, {1}, Bytes(60));
  EXPECT_EQ(p.Find(4, {1}), nullptr);
  EXPECT_NE(p.Find(5, {1}), nullptr);
  EXPECT_EQ(p.bytes(), 70u);
  // A step alone over the budget: what does not fit is served, not kept.
  EXPECT_EQ(p.Insert(5, {2}, Bytes(40))->size(), 40u);
  EXPECT_EQ(p.Find(5, {2}), nullptr);
  EXPECT_LE(p.bytes(), 100u);
  EXPECT_EQ(p.Insert(6, {0}, Bytes(101))->size(), 101u);
  EXPECT_EQ(p.Find(6, {0}), nullptr);
}

}  // namespace
}  // namespace tutti::packer
