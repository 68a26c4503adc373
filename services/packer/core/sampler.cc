#include "services/packer/core/sampler.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "common/rng.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

inline __attribute__((always_inline)) uint64_t FeistelPermutation::Encrypt(uint64_t x) const {
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

namespace {

#if defined(__x86_64__)
#define TUTTI_WIDE __attribute__((target("avx512f,avx512dq")))

// Encrypt on 8 positions (AVX-512DQ's 64-bit multiply): the same integer
// operations, so the same results.
struct WideKeys {
  __m512i mask, gamma, rk[4];
  __m128i shift;
};
TUTTI_WIDE inline __m512i EncryptWide(const WideKeys& k, __m512i x) {
  __m512i left = _mm512_srl_epi64(x, k.shift), right = _mm512_and_si512(x, k.mask);
  for (int r = 0; r < 4; ++r) {
    const __m512i f = _mm512_and_si512(
        _mm512_srli_epi64(_mm512_mullo_epi64(_mm512_xor_si512(right, k.rk[r]), k.gamma), 32),
        k.mask);
    const __m512i next = _mm512_xor_si512(left, f);
    left = right;
    right = next;
  }
  return _mm512_or_si512(_mm512_sll_epi64(left, k.shift), right);
}

// FeistelPermutation::Map's work with EncryptWide, by blocks of kWideBlock
// positions: every position encrypted 8 at a time; those outside [0, n)
// packed into a walking list with their places (AVX-512 compress), which
// is encrypted again 8 at a time, the finished ones scattered to their
// places and the rest packed again, until none is left. Only positions
// still walking are encrypted, and consecutive vectors are independent.
constexpr size_t kWideBlock = 1024;
TUTTI_WIDE void MapWide(const uint64_t* in, size_t count, uint64_t* out, uint64_t n,
                        uint32_t half_bits, uint64_t half_mask, const uint64_t* keys) {
  WideKeys k;
  k.mask = _mm512_set1_epi64(static_cast<int64_t>(half_mask));
  k.gamma = _mm512_set1_epi64(static_cast<int64_t>(kGoldenGamma));
  k.shift = _mm_cvtsi32_si128(static_cast<int>(half_bits));
  for (int r = 0; r < 4; ++r) k.rk[r] = _mm512_set1_epi64(static_cast<int64_t>(keys[r]));
  const __m512i limit = _mm512_set1_epi64(static_cast<int64_t>(n));
  const __m512i iota = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  // The walking lists (33 KB), off the stack of whichever thread plans.
  alignas(64) static thread_local uint64_t value[2][kWideBlock + 8], place[2][kWideBlock + 8];
  for (size_t b = 0; b < count; b += kWideBlock) {
    const size_t size = std::min(kWideBlock, count - b);
    uint64_t* block = out + b;
    size_t walking = 0;
    for (size_t at = 0; at < size; at += 8) {
      const __mmask8 lanes = static_cast<__mmask8>((1u << std::min<size_t>(8, size - at)) - 1);
      const __m512i v = EncryptWide(k, _mm512_maskz_loadu_epi64(lanes, in + b + at));
      _mm512_mask_storeu_epi64(block + at, lanes, v);
      const __mmask8 out_of_range = _mm512_mask_cmpge_epu64_mask(lanes, v, limit);
      _mm512_mask_compressstoreu_epi64(value[0] + walking, out_of_range, v);
      _mm512_mask_compressstoreu_epi64(
          place[0] + walking, out_of_range,
          _mm512_add_epi64(iota, _mm512_set1_epi64(static_cast<int64_t>(at))));
      walking += static_cast<size_t>(__builtin_popcount(out_of_range));
    }
    int cur = 0;
    while (walking > 0) {
      size_t next = 0;
      for (size_t j = 0; j < walking; j += 8) {
        const __mmask8 lanes = static_cast<__mmask8>((1u << std::min<size_t>(8, walking - j)) - 1);
        const __m512i v = EncryptWide(k, _mm512_maskz_loadu_epi64(lanes, value[cur] + j));
        const __m512i where = _mm512_maskz_loadu_epi64(lanes, place[cur] + j);
        const __mmask8 again = _mm512_mask_cmpge_epu64_mask(lanes, v, limit);
        _mm512_mask_i64scatter_epi64(block, static_cast<__mmask8>(lanes & ~again), where, v, 8);
        _mm512_mask_compressstoreu_epi64(value[1 - cur] + next, again, v);
        _mm512_mask_compressstoreu_epi64(place[1 - cur] + next, again, where);
        next += static_cast<size_t>(__builtin_popcount(again));
      }
      walking = next;
      cur = 1 - cur;
    }
  }
}
#undef TUTTI_WIDE

bool HasWideMultiply() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return has;
}
#else
void MapWide(const uint64_t*, size_t, uint64_t*, uint64_t, uint32_t, uint64_t, const uint64_t*) {}
bool HasWideMultiply() { return false; }
#endif

}  // namespace

void FeistelPermutation::Map(const uint64_t* in, size_t count, uint64_t* out) const {
  if (n_ <= 1) {
    std::fill(out, out + count, 0);
    return;
  }
  if (HasWideMultiply()) {
    MapWide(in, count, out, n_, half_bits_, half_mask_, keys_);
    return;
  }
  MapPortable(in, count, out);
}

void FeistelPermutation::MapPortable(const uint64_t* in, size_t count, uint64_t* out) const {
  if (n_ <= 1) {
    std::fill(out, out + count, 0);
    return;
  }
  // One encryption of every position, then again of those still outside
  // [0, n), until none is: each pass a loop without branches whose
  // iterations are independent, so their multiplications overlap. The
  // walks go by blocks, so that the positions still walking stay in a
  // small list.
  for (size_t k = 0; k < count; ++k) out[k] = Encrypt(in[k]);
  constexpr size_t kBlock = 512;
  uint32_t walking[kBlock];
  for (size_t b = 0; b < count; b += kBlock) {
    uint64_t* block = out + b;
    const uint32_t size = static_cast<uint32_t>(std::min(kBlock, count - b));
    uint32_t m = 0;
    for (uint32_t k = 0; k < size; ++k) {
      walking[m] = k;
      m += block[k] >= n_;
    }
    while (m > 0) {
      uint32_t kept = 0;
      for (uint32_t i = 0; i < m; ++i) {
        const uint32_t k = walking[i];
        const uint64_t y = Encrypt(block[k]);
        block[k] = y;
        walking[kept] = k;
        kept += y >= n_;
      }
      m = kept;
    }
  }
}

StreamSampler::StreamSampler(uint64_t seed, Stream stream, uint64_t n, uint64_t per_step)
    : StreamSampler(seed, StreamOptions{uint64_t(stream) + 1, n, 0, per_step, nullptr}) {}

StreamSampler::StreamSampler(uint64_t seed, const StreamOptions& o)
    : seed_(seed),
      key_(o.key),
      n_(std::max<uint64_t>(o.n, 1)),
      e_(o.epoch_size > 0 && o.epoch_size < n_ ? o.epoch_size : n_),
      per_step_(o.max_block),
      blocks_(o.blocks),
      perm_(e_, 0),
      walk_(n_, e_ < n_ ? Mix(seed ^ Mix(o.key) ^ 0x57414C4B57414C4Bull) : 0) {}

uint64_t StreamSampler::Key(uint64_t epoch) const {
  return Mix(seed_ ^ Mix(key_) ^ Mix(epoch * 0xD1B54A32D192ED03ull));
}

void StreamSampler::Walk(uint64_t epoch, uint64_t* v, size_t count) const {
  // Epoch e's window: walk positions (e x e_ + k) mod n_.
  const uint64_t first =
      static_cast<uint64_t>(static_cast<unsigned __int128>(epoch % n_) * e_ % n_);
  for (size_t k = 0; k < count; ++k) {
    const uint64_t x = first + v[k];
    v[k] = x >= n_ ? x - n_ : x;
  }
  walk_.Map(v, count, v);
}

uint64_t StreamSampler::Plain(uint64_t epoch, uint64_t i) {
  if (epoch != epoch_) {
    epoch_ = epoch;
    perm_ = FeistelPermutation(e_, Key(epoch));
  }
  uint64_t x = perm_(i);
  if (e_ < n_) Walk(epoch, &x, 1);
  return x;
}

void StreamSampler::PlainMany(uint64_t epoch, const uint64_t* in, size_t count, uint64_t* out) {
  if (epoch != epoch_) {
    epoch_ = epoch;
    perm_ = FeistelPermutation(e_, Key(epoch));
  }
  perm_.Map(in, count, out);
  if (e_ < n_) Walk(epoch, out, count);
}

void StreamSampler::PrepareStart(uint64_t epoch) {
  if (start_epoch_ == epoch) return;
  start_epoch_ = epoch;
  start_.clear();
  // The step that enters `epoch`, and what it took from the previous one
  // (the old epoch's last `tail` positions, never reordered: an epoch holds
  // at least two steps' draws).
  const uint64_t first = epoch * e_;
  uint64_t step_start = 0, per = per_step_;
  if (blocks_ != nullptr) {
    blocks_->BlockOf(first, &step_start, &per);
  } else {
    step_start = first / per_step_ * per_step_;
  }
  const uint64_t tail = first - step_start;
  if (tail == 0 || tail >= per) return;
  // Both epochs' positions in batches (PlainMany); the taken samples as a
  // bit set over the stream.
  thread_local std::vector<uint64_t> taken, head, bits;
  taken.resize(tail);
  for (uint64_t i = 0; i < tail; ++i) taken[i] = e_ - tail + i;
  PlainMany(epoch - 1, taken.data(), tail, taken.data());
  bits.assign(n_ / 64 + 1, 0);
  for (const uint64_t x : taken) bits[x / 64] |= uint64_t{1} << (x % 64);
  // The step's share of the new epoch: the first per - tail samples of its
  // permutation that the step did not already take; the ones it did follow
  // right behind, in permutation order. At most `tail` of the new epoch's
  // first per positions were taken, so they hold the share.
  const uint64_t share = per - tail;
  head.resize(per);
  for (uint64_t i = 0; i < per; ++i) head[i] = i;
  PlainMany(epoch, head.data(), per, head.data());
  std::vector<uint64_t> later;
  for (uint64_t i = 0; start_.size() < share; ++i) {
    const uint64_t x = head[i];
    ((bits[x / 64] >> (x % 64)) & 1 ? later : start_).push_back(x);
  }
  start_.insert(start_.end(), later.begin(), later.end());
}

uint64_t StreamSampler::At(uint64_t p) {
  const uint64_t epoch = p / e_, i = p % e_;
  if (per_step_ > 0 && epoch > 0 && i < per_step_) {
    PrepareStart(epoch);
    if (i < start_.size()) return start_[i];
  }
  return Plain(epoch, i);
}

void StreamSampler::AtMany(const uint64_t* pos, size_t count, uint64_t* out) {
  size_t k = 0;
  while (k < count) {
    const uint64_t epoch = pos[k] / e_;
    // The reordered start of an epoch goes through At; a run of positions
    // of one epoch past it, through the permutation in one batch.
    const uint64_t first = epoch * e_;
    const uint64_t start = per_step_ > 0 && epoch > 0 ? std::min(per_step_, e_) : 0;
    if (pos[k] - first < start) {
      out[k] = At(pos[k]);
      ++k;
      continue;
    }
    // The run: positions in [first + start, first + e_).
    size_t e = k;
    while (e < count && pos[e] >= first + start && pos[e] - first < e_) {
      out[e] = pos[e] - first;
      ++e;
    }
    PlainMany(epoch, out + k, e - k, out + k);
    k = e;
  }
}

uint64_t StepsForEpochs(uint64_t epochs, uint64_t n_text, uint64_t text_per_step, uint64_t n_vl,
                        uint64_t vl_per_step) {
  uint64_t steps = 0;
  for (const auto& [n, per] : {std::pair{n_text, text_per_step}, std::pair{n_vl, vl_per_step}}) {
    if (per == 0) continue;
    if (n == 0) return 0;
    steps = std::max(steps, (epochs * n + per - 1) / per);
  }
  return steps;
}

}  // namespace tutti::packer
