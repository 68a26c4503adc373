// Radix sorts of 64-bit values: the strategies' rank orders, (load bits <<
// 32 | rank), sorted hundreds of times a step, where a comparison sort
// mispredicts about every other branch; and the draw's candidates by
// sample id.
#ifndef TUTTI_SERVICES_PACKER_CORE_RADIX_SORT_H_
#define TUTTI_SERVICES_PACKER_CORE_RADIX_SORT_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace tutti::packer {

// Sorts *v ascending (the same result as std::sort): an LSD radix sort,
// 8 bits a pass, over the bytes in which the values differ (loads of one
// magnitude share their exponent, ranks below 4096 their upper bytes);
// std::sort below 64 values. *tmp: scratch.
inline void RadixSort64(std::vector<uint64_t>* v, std::vector<uint64_t>* tmp) {
  const size_t n = v->size();
  if (n < 64) {
    std::sort(v->begin(), v->end());
    return;
  }
  uint64_t differ = 0;
  const uint64_t first = (*v)[0];
  for (const uint64_t x : *v) differ |= x ^ first;
  tmp->resize(n);
  for (uint32_t shift = 0; shift < 64; shift += 8) {
    if ((differ >> shift & 0xFF) == 0) continue;
    uint32_t count[257] = {};
    for (const uint64_t x : *v) ++count[(x >> shift & 0xFF) + 1];
    for (uint32_t d = 0; d < 256; ++d) count[d + 1] += count[d];
    uint64_t* out = tmp->data();
    for (const uint64_t x : *v) out[count[x >> shift & 0xFF]++] = x;
    v->swap(*tmp);
  }
}

// Sorts entries (key << 32 | low), key < key_limit, by key, stably: an LSD
// radix sort, 11 bits a pass over the key's bits, every pass's counts taken
// in one read. *tmp: scratch.
inline void SortByUpper32(uint64_t key_limit, std::vector<uint64_t>* v,
                          std::vector<uint64_t>* tmp) {
  constexpr uint32_t kDigit = 11, kBuckets = 1u << kDigit;
  uint32_t bits = 0;
  while (bits < 32 && (uint64_t{1} << bits) < key_limit) ++bits;
  const uint32_t passes = (bits + kDigit - 1) / kDigit;
  if (passes == 0) return;
  thread_local std::vector<uint32_t> count;
  count.assign(size_t{passes} * kBuckets, 0);
  for (const uint64_t x : *v) {
    for (uint32_t p = 0; p < passes; ++p) {
      ++count[p * kBuckets + ((x >> (32 + p * kDigit)) & (kBuckets - 1))];
    }
  }
  tmp->resize(v->size());
  for (uint32_t p = 0; p < passes; ++p) {
    uint32_t* c = count.data() + p * kBuckets;
    uint32_t sum = 0;
    for (uint32_t b = 0; b < kBuckets; ++b) {
      const uint32_t n = c[b];
      c[b] = sum;
      sum += n;
    }
    const uint32_t shift = 32 + p * kDigit;
    uint64_t* out = tmp->data();
    for (const uint64_t x : *v) out[c[(x >> shift) & (kBuckets - 1)]++] = x;
    v->swap(*tmp);
  }
}

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_RADIX_SORT_H_
