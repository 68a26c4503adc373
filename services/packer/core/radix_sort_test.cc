#include "services/packer/core/radix_sort.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::packer {
namespace {

TEST(RadixSortTest, SortsLikeStdSort) {
  uint64_t state = 0x243F6A8885A308D3ull;
  auto next = [&] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  };
  std::vector<uint64_t> v, tmp;
  for (int trial = 0; trial < 400; ++trial) {
    const size_t n = next() % 3000;
    v.clear();
    for (size_t i = 0; i < n; ++i) {
      switch (trial % 4) {
        case 0:  // any 64-bit values
          v.push_back(next());
          break;
        case 1: {  // (float load bits << 32 | rank), loads of one magnitude
          const float load = 1000.0f + static_cast<float>(next() % 100000) / 1000.0f;
          uint32_t bits;
          std::memcpy(&bits, &load, 4);
          v.push_back(uint64_t{bits} << 32 | i);
          break;
        }
        case 2:  // few distinct values, repeated
          v.push_back((next() % 5) << 40 | (next() % 3));
          break;
        default:  // all equal
          v.push_back(0x0123456789ABCDEFull);
      }
    }
    std::vector<uint64_t> want = v;
    std::sort(want.begin(), want.end());
    RadixSort64(&v, &tmp);
    ASSERT_EQ(v, want) << "trial " << trial << ", " << n << " values";
  }
}

}  // namespace
}  // namespace tutti::packer
