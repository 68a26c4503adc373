// The sampler: which samples make up the global batch of a step.
//
// Each stream (text-only, vision-language) cycles through its own epochs,
// each epoch a permutation keyed by (seed, stream, epoch): a Feistel network
// over the next power of four with cycle walking, so any position can be
// mapped in O(1) time and memory and any step can be planned directly
// (resume at step 1,000,000 without replaying). Stream position
// p = step * per_step + j; its epoch is p / n. Nothing depends on the world
// size: ranks only split the global batch.
//
// Exactly once: every epoch of a stream draws each of its n samples once,
// and no step draws a sample twice. A step that spans an epoch boundary
// takes the rest of the old epoch's order and the start of the new one; the
// new epoch's order is its permutation with the samples the step already
// took from the old epoch moved back, just behind the step's share (so they
// come in the next step instead): a bijection of the epoch that only the
// first per_step positions feel, computed in O(per_step) for those two
// steps. This needs n >= 2 * per_step (the job refuses smaller streams).
//
// A mixture's source (mixture.h) is such a stream too, with two
// generalisations (StreamOptions): its steps draw varying counts, so the
// step that spans an epoch boundary is asked of StepBlocks; and an epoch may
// hold fewer than its n samples (max_samples_per_epoch), each epoch then a
// window of that many in a fixed order of all n (the next epoch the next
// window), permuted within.
#ifndef TUTTI_SERVICES_PACKER_CORE_SAMPLER_H_
#define TUTTI_SERVICES_PACKER_CORE_SAMPLER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tutti::packer {

// A keyed bijection on [0, n).
class FeistelPermutation {
 public:
  FeistelPermutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t i) const;
  // out[k] = (*this)(in[k]) for k < count (out may be in): several
  // positions at once, so that their encryptions overlap.
  void Map(const uint64_t* in, size_t count, uint64_t* out) const;
  // Map without its AVX-512 path (what CPUs without it run): the same
  // results.
  void MapPortable(const uint64_t* in, size_t count, uint64_t* out) const;
  uint64_t size() const { return n_; }

 private:
  uint64_t Encrypt(uint64_t x) const;

  uint64_t n_;
  uint32_t half_bits_;
  uint64_t half_mask_;
  uint64_t keys_[4];
};

enum class Stream : uint32_t { kText = 0, kVl = 1 };

// Where the steps' draws of a stream begin: a mixture's source draws a count
// that varies from step to step (apportion.h), so its blocks are not all
// one length.
class StepBlocks {
 public:
  virtual ~StepBlocks() = default;
  // The first position of the step's draw that holds stream position p,
  // and how many positions that draw has.
  virtual void BlockOf(uint64_t p, uint64_t* start, uint64_t* length) const = 0;
};

struct StreamOptions {
  // Keys the stream's permutations: uint64_t(Stream) + 1 for the job's two
  // streams, a digest of the name for a mixture's source.
  uint64_t key = 1;
  uint64_t n = 1;  // samples, at least 1
  // Samples an epoch holds (0 or >= n: all n). Below n an epoch is a window
  // of this many in a fixed order of all n (keyed by the seed and key), the
  // next epoch the next window, so the epochs walk through every sample.
  uint64_t epoch_size = 0;
  // The most positions one step draws (0: no exactly-once reordering).
  // Requires an epoch of at least 2 x max_block samples.
  uint64_t max_block = 0;
  // The steps' draws; null: blocks of max_block positions from 0.
  const StepBlocks* blocks = nullptr;
};

// Maps stream positions to stream-local indices (0..n-1), caching the
// permutation of the last epoch used and the reordered start of the last
// epoch entered mid-step. Not thread-safe; cheap to create.
class StreamSampler {
 public:
  // per_step: the positions one step draws (0: no exactly-once reordering,
  // plain permutations). Requires n >= 2 * per_step.
  StreamSampler(uint64_t seed, Stream stream, uint64_t n, uint64_t per_step = 0);
  StreamSampler(uint64_t seed, const StreamOptions& options);
  // Stream-local index at stream position p.
  uint64_t At(uint64_t p);
  // out[k] = At(pos[k]) for k < count.
  void AtMany(const uint64_t* pos, size_t count, uint64_t* out);
  uint64_t size() const { return n_; }
  uint64_t epoch_size() const { return e_; }
  uint64_t EpochOf(uint64_t p) const { return p / e_; }

 private:
  uint64_t Key(uint64_t epoch) const;
  uint64_t Plain(uint64_t epoch, uint64_t i);
  // out[k] = Plain(epoch, in[k]), in batches (out may be in).
  void PlainMany(uint64_t epoch, const uint64_t* in, size_t count, uint64_t* out);
  // Where epoch e's window starts in the walk (epoch_size < n).
  void Walk(uint64_t epoch, uint64_t* v, size_t count) const;
  void PrepareStart(uint64_t epoch);

  uint64_t seed_;
  uint64_t key_;
  uint64_t n_;
  uint64_t e_;  // epoch size
  uint64_t per_step_;
  const StepBlocks* blocks_;
  uint64_t epoch_ = UINT64_MAX;
  FeistelPermutation perm_;
  FeistelPermutation walk_;  // over n_, when e_ < n_
  // The reordered start of epoch start_epoch_: positions [0, start_.size()).
  uint64_t start_epoch_ = UINT64_MAX;
  std::vector<uint64_t> start_;
};

// Steps after which every sample of every stream a step draws from was
// drawn `epochs` times: the maximum over the streams of
// ceil(epochs * n / per_step). Each stream cycles on its own, so the faster
// one is already into its next epoch then. 0 when a stream a step needs is
// empty.
uint64_t StepsForEpochs(uint64_t epochs, uint64_t n_text, uint64_t text_per_step, uint64_t n_vl,
                        uint64_t vl_per_step);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_SAMPLER_H_
