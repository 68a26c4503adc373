// The sampler: which samples make up the global batch of a step.
//
// Each stream (text-only, vision-language) has its own epoch permutation,
// keyed by (seed, stream, epoch): a Feistel network over the next power of
// four with cycle walking, so any position can be mapped in O(1) time and
// memory and any step can be planned directly (resume at step 1,000,000
// without replaying). Stream position p = step * per_step + j; its epoch is
// p / n and its place in that epoch's permutation p % n. Nothing depends on
// the world size: ranks only split the global batch.
#ifndef TUTTI_SERVICES_PACKER_CORE_SAMPLER_H_
#define TUTTI_SERVICES_PACKER_CORE_SAMPLER_H_

#include <cstdint>

namespace tutti::packer {

// A keyed bijection on [0, n).
class FeistelPermutation {
 public:
  FeistelPermutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t i) const;
  uint64_t size() const { return n_; }

 private:
  uint64_t Encrypt(uint64_t x) const;

  uint64_t n_;
  uint32_t half_bits_;
  uint64_t half_mask_;
  uint64_t keys_[4];
};

enum class Stream : uint32_t { kText = 0, kVl = 1 };

// Maps stream positions to stream-local indices (0..n-1), caching the
// permutation of the last epoch used. Not thread-safe; cheap to create.
class StreamSampler {
 public:
  StreamSampler(uint64_t seed, Stream stream, uint64_t n);
  // Stream-local index at stream position p.
  uint64_t At(uint64_t p);
  uint64_t size() const { return n_; }

 private:
  uint64_t seed_;
  Stream stream_;
  uint64_t n_;
  uint64_t epoch_ = UINT64_MAX;
  FeistelPermutation perm_;
};

// Steps per epoch given stream sizes and per-step draws: the minimum over
// the streams a step draws from of floor(n / per_step). 0 when a stream a
// step needs is smaller than one step's draw (or empty).
uint64_t StepsPerEpoch(uint64_t n_text, uint64_t text_per_step, uint64_t n_vl,
                       uint64_t vl_per_step);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_SAMPLER_H_
