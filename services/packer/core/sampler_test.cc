#include "services/packer/core/sampler.h"

#include <vector>

#include "gtest/gtest.h"

namespace tutti::packer {
namespace {

TEST(SamplerTest, FeistelIsABijectionForAnySize) {
  for (uint64_t n : {1ull, 2ull, 3ull, 5ull, 16ull, 17ull, 1000ull, 4097ull, 65536ull, 100003ull}) {
    FeistelPermutation perm(n, 42 + n);
    std::vector<bool> seen(n, false);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t y = perm(i);
      ASSERT_LT(y, n);
      ASSERT_FALSE(seen[y]) << "n " << n;
      seen[y] = true;
    }
  }
}

TEST(SamplerTest, KeysGiveDifferentOrders) {
  FeistelPermutation a(1000, 1), b(1000, 2);
  int same = 0;
  for (uint64_t i = 0; i < 1000; ++i) same += a(i) == b(i);
  EXPECT_LT(same, 20);
  int fixed = 0;
  for (uint64_t i = 0; i < 1000; ++i) fixed += a(i) == i;
  EXPECT_LT(fixed, 20);
}

TEST(SamplerTest, StreamEpochsAreFullPermutationsAndRandomAccess) {
  StreamSampler s(7, Stream::kVl, 500);
  for (uint64_t epoch : {0ull, 1ull, 123456789ull}) {
    std::vector<bool> seen(500, false);
    for (uint64_t i = 0; i < 500; ++i) {
      const uint64_t x = s.At(epoch * 500 + i);
      ASSERT_FALSE(seen[x]);
      seen[x] = true;
    }
  }
  StreamSampler fresh(7, Stream::kVl, 500);
  EXPECT_EQ(fresh.At(123456789ull * 500 + 17), s.At(123456789ull * 500 + 17));
  StreamSampler text(7, Stream::kText, 500);
  int same = 0;
  for (uint64_t i = 0; i < 500; ++i) same += text.At(i) == fresh.At(i);
  EXPECT_LT(same, 20);  // streams use their own keys
}

TEST(SamplerTest, StepsPerEpoch) {
  EXPECT_EQ(StepsPerEpoch(1000, 10, 100, 2), 50u);
  EXPECT_EQ(StepsPerEpoch(1000, 10, 0, 0), 100u);
  EXPECT_EQ(StepsPerEpoch(5, 10, 100, 2), 0u);
}

}  // namespace
}  // namespace tutti::packer
