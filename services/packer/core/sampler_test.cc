#include "services/packer/core/sampler.h"

#include <algorithm>
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

TEST(SamplerTest, StepsForEpochsLetEachStreamCycleOnItsOwn) {
  // Text: 1000 / 10 = 100 steps an epoch; VL: 100 / 3 = 33.3.
  EXPECT_EQ(StepsForEpochs(1, 1000, 10, 100, 3), 100u);
  EXPECT_EQ(StepsForEpochs(2, 1000, 10, 100, 3), 200u);
  EXPECT_EQ(StepsForEpochs(1, 100, 3, 0, 0), 34u);  // the remainder is drawn, not dropped
  EXPECT_EQ(StepsForEpochs(1, 1000, 10, 0, 2), 0u);
}

// Exactly once: no step draws a sample twice, and every epoch of a stream
// draws each sample once, for stream sizes the steps do not divide.
TEST(SamplerTest, EveryStepAndEveryEpochDrawsEachSampleOnce) {
  for (const auto& [n, per] : {std::pair<uint64_t, uint64_t>{500, 7},
                               {500, 250},
                               {97, 13},
                               {1000, 300},
                               {64, 32},
                               {101, 50}}) {
    StreamSampler s(3, Stream::kText, n, per);
    const uint64_t steps = 5 * n / per + 3;
    std::vector<uint32_t> count(n, 0);
    uint64_t epoch = 0;
    for (uint64_t step = 0; step < steps; ++step) {
      std::vector<bool> in_step(n, false);
      for (uint64_t j = 0; j < per; ++j) {
        const uint64_t p = step * per + j;
        if (p / n != epoch) {  // an epoch just ended: each sample once
          for (uint64_t x = 0; x < n; ++x) ASSERT_EQ(count[x], 1u) << n << "/" << per;
          count.assign(n, 0);
          epoch = p / n;
        }
        const uint64_t x = s.At(p);
        ASSERT_LT(x, n);
        ASSERT_FALSE(in_step[x]) << "n " << n << " per " << per << " step " << step;
        in_step[x] = true;
        ++count[x];
      }
    }
    // Random access: a fresh sampler gives the same sample at any position.
    StreamSampler fresh(3, Stream::kText, n, per);
    for (uint64_t p : {uint64_t{0}, n - 1, n, n + 1, 3 * n + per / 2, steps * per - 1}) {
      EXPECT_EQ(fresh.At(p), s.At(p)) << p;
    }
  }
}

// Batches give what one position at a time gives: runs within an epoch,
// across epoch boundaries (the reordered start of an epoch), out of order
// (deferred positions ahead of the step's own), and every lane count.
TEST(SamplerTest, BatchesMapLikeSinglePositions) {
  // Sizes just above and at powers of 4 (the longest and shortest cycle
  // walks), and counts around the batches' vectors of 8 and groups of 32.
  for (uint64_t n : {1ull, 2ull, 5ull, 97ull, 1000ull, 4097ull, 65536ull, 65537ull, 1048577ull,
                     (1ull << 40) + 3}) {
    FeistelPermutation perm(n, 9 + n);
    std::vector<uint64_t> in, out;
    for (uint64_t i = 0; i < std::min<uint64_t>(n, 3000); ++i) in.push_back(i * 7 % n);
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{31},
                         size_t{32}, size_t{33}, size_t{65}, in.size()}) {
      count = std::min(count, in.size());
      out.assign(count, UINT64_MAX);
      perm.Map(in.data(), count, out.data());
      for (size_t k = 0; k < count; ++k) ASSERT_EQ(out[k], perm(in[k])) << n << " " << k;
      out.assign(count, UINT64_MAX);
      perm.MapPortable(in.data(), count, out.data());
      for (size_t k = 0; k < count; ++k) ASSERT_EQ(out[k], perm(in[k])) << n << " " << k;
    }
    std::vector<uint64_t> same = in;  // in place
    perm.Map(same.data(), same.size(), same.data());
    for (size_t k = 0; k < in.size(); ++k) ASSERT_EQ(same[k], perm(in[k]));
  }
  for (const auto& [n, per] : {std::pair<uint64_t, uint64_t>{500, 7}, {97, 13}, {101, 50}}) {
    StreamSampler one(3, Stream::kVl, n, per), many(3, Stream::kVl, n, per);
    for (uint64_t step : {uint64_t{0}, uint64_t{1}, n / per, n / per + 1, 7 * n / per}) {
      std::vector<uint64_t> pos = {step > 0 ? step * per - 1 : 0, 3, n + 2};
      for (uint64_t j = 0; j < per; ++j) pos.push_back(step * per + j);
      std::vector<uint64_t> out(pos.size());
      many.AtMany(pos.data(), pos.size(), out.data());
      for (size_t k = 0; k < pos.size(); ++k) {
        ASSERT_EQ(out[k], one.At(pos[k])) << n << "/" << per << " step " << step << " " << k;
      }
    }
  }
}

}  // namespace
}  // namespace tutti::packer
