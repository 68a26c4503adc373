#include "services/packer/core/sampler.h"

#include <algorithm>
#include <limits>

#include "common/rng.h"

namespace tutti::packer {
namespace {

uint64_t Mix(uint64_t x) { return SplitMix64Of(x); }

}  // namespace

FeistelPermutation::FeistelPermutation(uint64_t n, uint64_t key) : n_(n) {
  uint32_t bits = 2;
  while (bits < 64 && (uint64_t{1} << bits) < n) bits += 2;
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  uint64_t k = key;
  for (uint64_t& rk : keys_) {
    k = Mix(k);
    rk = k;
  }
}

uint64_t FeistelPermutation::Encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (uint64_t rk : keys_) {
    // Round function: a keyed multiplicative hash (high bits of one 64-bit
    // product); any function makes a Feistel network a bijection.
    const uint64_t f = (((right ^ rk) * kGoldenGamma) >> 32) & half_mask_;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t FeistelPermutation::operator()(uint64_t i) const {
  if (n_ <= 1) return 0;
  // The network permutes [0, 4^k) with 4^k < 4n; walking the cycle from i
  // until it lands in [0, n) restricts it to a bijection on [0, n).
  uint64_t y = Encrypt(i);
  while (y >= n_) y = Encrypt(y);
  return y;
}

StreamSampler::StreamSampler(uint64_t seed, Stream stream, uint64_t n)
    : seed_(seed), stream_(stream), n_(n), perm_(std::max<uint64_t>(n, 1), 0) {}

uint64_t StreamSampler::At(uint64_t p) {
  const uint64_t epoch = p / n_;
  if (epoch != epoch_) {
    epoch_ = epoch;
    const uint64_t key =
        Mix(seed_ ^ Mix(uint64_t(stream_) + 1) ^ Mix(epoch * 0xD1B54A32D192ED03ull));
    perm_ = FeistelPermutation(n_, key);
  }
  return perm_(p % n_);
}

uint64_t StepsPerEpoch(uint64_t n_text, uint64_t text_per_step, uint64_t n_vl,
                       uint64_t vl_per_step) {
  uint64_t steps = std::numeric_limits<uint64_t>::max();
  if (text_per_step > 0) steps = std::min(steps, n_text / text_per_step);
  if (vl_per_step > 0) steps = std::min(steps, n_vl / vl_per_step);
  return steps == std::numeric_limits<uint64_t>::max() ? 0 : steps;
}

}  // namespace tutti::packer
