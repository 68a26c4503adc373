#include "services/stager/decode/resample.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#include "services/stager/decode/image_buffer.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TUTTI_RESAMPLE_AVX2 1
#endif

namespace tutti::stager {
namespace {

// Keys' cubic convolution kernel with a = -0.5 (the one PIL calls BICUBIC).
double Bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

constexpr int kPrecision = kResamplePrecision;
constexpr int32_t kHalf = 1 << (kPrecision - 1);  // every sum starts at one half, as PIL's

// PIL's clip8: the sum shifted to 8 bits, clipped to 0..255.
inline uint8_t Clip8(int32_t acc) {
  const int32_t v = acc >> kPrecision;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// The AVX2 kernels multiply 16-bit values (madd): a weight w (|w| < 2^23) is
// split as hi * 2^kSplit + lo with 0 <= lo < 2^kSplit, both within int16,
// and a sum is (sum of v * hi) << kSplit plus the sum of v * lo. Vector adds
// and shifts wrap modulo 2^32 and the true sum fits in int32 (as it must in
// PIL), so the result is exactly PIL's.
constexpr int kSplit = 11;
inline int16_t WeightHigh(int32_t w) { return static_cast<int16_t>(w >> kSplit); }
inline int16_t WeightLow(int32_t w) { return static_cast<int16_t>(w & ((1 << kSplit) - 1)); }

// ---- portable loops ----

// One output row of the horizontal pass, output pixels [x0, x1).
void HorizontalRowScalar(const uint8_t* src, uint8_t* dst, const AxisFilter& f, int x0, int x1) {
  for (int x = x0; x < x1; ++x) {
    const uint8_t* p = src + size_t{3} * f.first[x];
    const int32_t* k = f.weights.data() + static_cast<size_t>(x) * f.taps;
    int32_t b = kHalf, g = kHalf, r = kHalf;
    for (int t = 0; t < f.count[x]; ++t, p += 3) {
      b += p[0] * k[t];
      g += p[1] * k[t];
      r += p[2] * k[t];
    }
    dst[3 * x + 0] = Clip8(b);
    dst[3 * x + 1] = Clip8(g);
    dst[3 * x + 2] = Clip8(r);
  }
}

// One output row of the vertical pass over bytes [i0, i1) of the rows.
void VerticalRowScalar(const uint8_t* const* rows, const int32_t* k, int count, size_t i0,
                       size_t i1, uint8_t* dst) {
  for (size_t i = i0; i < i1; ++i) {
    int32_t acc = kHalf;
    for (int t = 0; t < count; ++t) acc += rows[t][i] * k[t];
    dst[i] = Clip8(acc);
  }
}

// ---- AVX2 kernels (same integer arithmetic, so the same bytes) ----

#if TUTTI_RESAMPLE_AVX2
bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}

// A sum from its high-part and low-part sums (kSplit; the half is in the
// low one), shifted to 8 bits (not yet clipped).
__attribute__((target("avx2"))) inline __m256i JoinSums(__m256i high, __m256i low) {
  return _mm256_srai_epi32(_mm256_add_epi32(_mm256_slli_epi32(high, kSplit), low), kPrecision);
}

// Weights of the horizontal pass laid out for the kernel, which computes two
// output pixels at once, one per 128-bit lane, two taps per step: per pair
// of pixels (x, x + 1) and step, 16 int16 of the weights' high parts: (w0 w1)
// x3 for B, G, R and two zeros for pixel x, then the same for x + 1 (zeros
// past a pixel's taps); then 16 of their low parts, alike.
struct PackedHorizontal {
  std::vector<int16_t> weights;
  std::vector<int> steps;     // per pair
  std::vector<size_t> start;  // per pair, in units of 16 weights
  std::vector<bool> safe;     // per pair: its 16-byte loads stay inside a row
};

PackedHorizontal PackHorizontal(const AxisFilter& f) {
  PackedHorizontal p;
  const int pairs = f.out_size / 2;
  p.steps.resize(pairs);
  p.start.resize(pairs);
  p.safe.resize(pairs);
  size_t total = 0;
  for (int pr = 0; pr < pairs; ++pr) {
    const int x = 2 * pr;
    p.steps[pr] = (std::max(f.count[x], f.count[x + 1]) + 1) / 2;
    p.start[pr] = total;
    total += p.steps[pr];
    bool safe = true;
    for (int xx : {x, x + 1})
      safe &= 3 * (f.first[xx] + 2 * (p.steps[pr] - 1)) + 16 <= 3 * f.in_size;
    p.safe[pr] = safe;
  }
  p.weights.assign(total * 32, 0);
  for (int pr = 0; pr < pairs; ++pr) {
    for (int lane = 0; lane < 2; ++lane) {
      const int x = 2 * pr + lane;
      const int32_t* k = f.weights.data() + static_cast<size_t>(x) * f.taps;
      for (int st = 0; st < p.steps[pr]; ++st) {
        int16_t* d = p.weights.data() + (p.start[pr] + st) * 32 + 8 * lane;
        const int t = 2 * st;
        const int32_t w0 = t < f.count[x] ? k[t] : 0, w1 = t + 1 < f.count[x] ? k[t + 1] : 0;
        for (int c = 0; c < 3; ++c) {
          d[2 * c] = WeightHigh(w0);
          d[2 * c + 1] = WeightHigh(w1);
          d[16 + 2 * c] = WeightLow(w0);
          d[16 + 2 * c + 1] = WeightLow(w1);
        }
      }
    }
  }
  return p;
}

// Sums of the pair (x, x + 1), without the half: lane 0 holds pixel x's
// (B, G, R, 0), lane 1 x + 1's.
__attribute__((target("avx2"))) inline __m256i HorizontalPairAvx2(const uint8_t* src,
                                                                  const AxisFilter& f,
                                                                  const PackedHorizontal& p,
                                                                  int pr) {
  // Widens pixels t, t + 1 of each lane to (B B G G R R 0 0).
  const __m256i shuffle =
      _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1, 0, -1, 3, -1, 1,
                       -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const uint8_t* a = src + size_t{3} * f.first[2 * pr];
  const uint8_t* b = src + size_t{3} * f.first[2 * pr + 1];
  const int16_t* k = p.weights.data() + p.start[pr] * 32;
  __m256i high = _mm256_setzero_si256(), low = _mm256_setzero_si256();
  for (int st = 0; st < p.steps[pr]; ++st, a += 6, b += 6, k += 32) {
    const __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
    const __m256i px = _mm256_shuffle_epi8(v, shuffle);
    high = _mm256_add_epi32(
        high, _mm256_madd_epi16(px, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k))));
    low = _mm256_add_epi32(
        low, _mm256_madd_epi16(px, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + 16))));
  }
  return _mm256_add_epi32(_mm256_slli_epi32(high, kSplit), low);
}

__attribute__((target("avx2"))) void HorizontalRowAvx2(const uint8_t* src, uint8_t* dst,
                                                       const AxisFilter& f,
                                                       const PackedHorizontal& p) {
  const __m256i half = _mm256_set1_epi32(kHalf);
  // (B G R 0) x4 -> 12 bytes of BGR.
  const __m128i compact = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  const int out = f.out_size;
  int x = 0;
  // Four pixels (two pairs) per round, so their rounding, packing and store
  // are shared; pixels whose loads would leave the row go the portable way.
  for (; x + 4 <= out; x += 4) {
    const int pr = x / 2;
    if (!p.safe[pr] || !p.safe[pr + 1]) {
      HorizontalRowScalar(src, dst, f, x, x + 4);
      continue;
    }
    const __m256i a =
        _mm256_srai_epi32(_mm256_add_epi32(HorizontalPairAvx2(src, f, p, pr), half), kPrecision);
    const __m256i b = _mm256_srai_epi32(
        _mm256_add_epi32(HorizontalPairAvx2(src, f, p, pr + 1), half), kPrecision);
    // Lane 0: pixels x, x + 2; lane 1: x + 1, x + 3.
    const __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_setzero_si256());
    const __m128i px = _mm_shuffle_epi8(
        _mm_unpacklo_epi32(_mm256_castsi256_si128(bytes), _mm256_extracti128_si256(bytes, 1)),
        compact);
    uint8_t* d = dst + size_t{3} * x;
    if (3 * x + 16 <= 3 * out) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d), px);  // the 4 extra bytes are rewritten next
    } else {
      alignas(16) uint8_t tmp[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(tmp), px);
      std::memcpy(d, tmp, 12);
    }
  }
  HorizontalRowScalar(src, dst, f, x, out);
}

// The horizontal pass where each output pixel reads few input pixels (no
// shrink, or a small one): output pixels go in blocks of 32 (96 bytes) that
// read their taps from one common run of input pixels, so the pass is the
// vertical kernel's sum of shifted rows, byte for byte, with a weight per
// byte instead of one per row: output byte j of the block is
// sum_t w[t][j] * in[j + 3 * (start + t)], w zero where pixel j / 3 has no
// tap t. Same integer sums as the portable loop, so the same bytes.
constexpr int kBlockPixels = 32;
constexpr int kMaxBlockPairs = 4;  // taps per block up to 8; wider filters use the pair kernel

struct ByteBlocks {
  std::vector<int> start;      // per block: the input pixel its tap 0 reads
  std::vector<int> pairs;      // per block: tap pairs; 0 = the portable loop
  std::vector<size_t> offset;  // per block: its first weight vector
  // Per block, pair and 32-byte third of the block: four vectors of 16
  // int16, the high parts of (w[t][j], w[t + 1][j]) for the bytes j that
  // VerticalRowAvx2's unpacks bring to accumulators 0..3, then four of the
  // low parts.
  std::vector<int16_t> weights;
};

// The blocks for `f`, or nothing (empty start) when some block would need
// more than kMaxBlockPairs pairs.
ByteBlocks PackByteBlocks(const AxisFilter& f) {
  ByteBlocks b;
  const int blocks = f.out_size / kBlockPixels;
  b.start.resize(blocks);
  b.pairs.resize(blocks);
  b.offset.resize(blocks);
  size_t vectors = 0;
  for (int k = 0; k < blocks; ++k) {
    // Pixel x0 + i's tap t reads input pixel start + i + t: start is the
    // lowest first[x] - (x - x0), taps the widest reach past it.
    const int x0 = k * kBlockPixels;
    int start = f.first[x0], taps = 0;
    for (int x = x0; x < x0 + kBlockPixels; ++x) start = std::min(start, f.first[x] - (x - x0));
    for (int x = x0; x < x0 + kBlockPixels; ++x) {
      taps = std::max(taps, f.first[x] - (x - x0) - start + f.count[x]);
    }
    const int pairs = (taps + 1) / 2;
    if (pairs > kMaxBlockPairs) return ByteBlocks{};
    // Its loads: 96 bytes from each of input pixels start .. start + 2 * pairs - 1.
    const bool inside = start >= 0 && 3 * (start + 2 * pairs - 1) + 96 <= 3 * f.in_size;
    b.start[k] = start;
    b.pairs[k] = inside ? pairs : 0;
    b.offset[k] = vectors;
    if (inside) vectors += size_t{24} * pairs;
  }
  b.weights.assign(vectors * 16, 0);
  for (int k = 0; k < blocks; ++k) {
    const int x0 = k * kBlockPixels;
    for (int pr = 0; pr < b.pairs[k]; ++pr) {
      for (int third = 0; third < 3; ++third) {
        int16_t* v = b.weights.data() + (b.offset[k] + size_t{24} * pr + 8 * third) * 16;
        for (int acc = 0; acc < 4; ++acc) {
          for (int lane = 0; lane < 2; ++lane) {
            for (int i = 0; i < 4; ++i) {
              const int j = 32 * third + 16 * lane + 4 * acc + i;  // byte of the block
              const int x = x0 + j / 3;
              for (int half = 0; half < 2; ++half) {
                const int tap = b.start[k] + (x - x0) + 2 * pr + half - f.first[x];
                const int32_t w =
                    tap >= 0 && tap < f.count[x] ? f.weights[size_t{1} * x * f.taps + tap] : 0;
                v[16 * acc + 8 * lane + 2 * i + half] = WeightHigh(w);
                v[16 * (acc + 4) + 8 * lane + 2 * i + half] = WeightLow(w);
              }
            }
          }
        }
      }
    }
  }
  return b;
}

__attribute__((target("avx2"))) void HorizontalRowBlocksAvx2(const uint8_t* src, uint8_t* dst,
                                                             const AxisFilter& f,
                                                             const ByteBlocks& b) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i half = _mm256_set1_epi32(kHalf);
  const int blocks = static_cast<int>(b.start.size());
  for (int k = 0; k < blocks; ++k) {
    const int x0 = k * kBlockPixels;
    if (b.pairs[k] == 0) {
      HorizontalRowScalar(src, dst, f, x0, x0 + kBlockPixels);
      continue;
    }
    for (int third = 0; third < 3; ++third) {
      const uint8_t* s = src + size_t{3} * b.start[k] + 32 * third;
      const __m256i* w =
          reinterpret_cast<const __m256i*>(b.weights.data()) + b.offset[k] + 8 * third;
      // Named accumulators (not arrays) so that they stay in registers.
      __m256i h0 = zero, h1 = zero, h2 = zero, h3 = zero;
      __m256i l0 = half, l1 = half, l2 = half, l3 = half;
      for (int pr = 0; pr < b.pairs[k]; ++pr, s += 6, w += 24) {
        const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
        const __m256i vb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 3));
        const __m256i lo = _mm256_unpacklo_epi8(va, vb), hi = _mm256_unpackhi_epi8(va, vb);
        const __m256i p0 = _mm256_unpacklo_epi8(lo, zero), p1 = _mm256_unpackhi_epi8(lo, zero);
        const __m256i p2 = _mm256_unpacklo_epi8(hi, zero), p3 = _mm256_unpackhi_epi8(hi, zero);
        h0 = _mm256_add_epi32(h0, _mm256_madd_epi16(p0, _mm256_loadu_si256(w)));
        h1 = _mm256_add_epi32(h1, _mm256_madd_epi16(p1, _mm256_loadu_si256(w + 1)));
        h2 = _mm256_add_epi32(h2, _mm256_madd_epi16(p2, _mm256_loadu_si256(w + 2)));
        h3 = _mm256_add_epi32(h3, _mm256_madd_epi16(p3, _mm256_loadu_si256(w + 3)));
        l0 = _mm256_add_epi32(l0, _mm256_madd_epi16(p0, _mm256_loadu_si256(w + 4)));
        l1 = _mm256_add_epi32(l1, _mm256_madd_epi16(p1, _mm256_loadu_si256(w + 5)));
        l2 = _mm256_add_epi32(l2, _mm256_madd_epi16(p2, _mm256_loadu_si256(w + 6)));
        l3 = _mm256_add_epi32(l3, _mm256_madd_epi16(p3, _mm256_loadu_si256(w + 7)));
      }
      const __m256i a0 = JoinSums(h0, l0), a1 = JoinSums(h1, l1);
      const __m256i a2 = JoinSums(h2, l2), a3 = JoinSums(h3, l3);
      const __m256i out =
          _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a3));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + size_t{3} * x0 + 32 * third), out);
    }
  }
  HorizontalRowScalar(src, dst, f, blocks * kBlockPixels, f.out_size);
}

// The two int16 parts (kSplit) of taps t and t + 1 in each 32-bit lane.
__attribute__((target("avx2"))) inline __m256i WeightPair(int16_t w0, int16_t w1) {
  return _mm256_set1_epi32(
      static_cast<int32_t>(uint32_t{static_cast<uint16_t>(w1)} << 16 | static_cast<uint16_t>(w0)));
}

__attribute__((target("avx2"))) void VerticalRowAvx2(const uint8_t* const* rows, const int32_t* k,
                                                     int count, size_t bytes, uint8_t* dst) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i half = _mm256_set1_epi32(kHalf);
  // The row's weights, high and low parts of each pair of taps, once.
  struct alignas(32) Vector {
    __m256i v;
  };
  thread_local std::vector<Vector> weights;
  const int pairs = (count + 1) / 2;
  weights.resize(2 * static_cast<size_t>(pairs));
  for (int pr = 0; pr < pairs; ++pr) {
    const int32_t w0 = k[2 * pr], w1 = 2 * pr + 1 < count ? k[2 * pr + 1] : 0;
    weights[2 * pr].v = WeightPair(WeightHigh(w0), WeightHigh(w1));
    weights[2 * pr + 1].v = WeightPair(WeightLow(w0), WeightLow(w1));
  }
  const Vector* wv = weights.data();
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    // Named accumulators (not arrays) so that they stay in registers.
    __m256i h0 = zero, h1 = zero, h2 = zero, h3 = zero;
    __m256i l0 = half, l1 = half, l2 = half, l3 = half;
    for (int pr = 0; pr < pairs; ++pr) {
      const int t = 2 * pr;
      const __m256i wh = wv[t].v, wl = wv[t + 1].v;
      const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[t] + i));
      const __m256i vb = t + 1 < count
                             ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[t + 1] + i))
                             : zero;
      const __m256i lo = _mm256_unpacklo_epi8(va, vb), hi = _mm256_unpackhi_epi8(va, vb);
      const __m256i p0 = _mm256_unpacklo_epi8(lo, zero), p1 = _mm256_unpackhi_epi8(lo, zero);
      const __m256i p2 = _mm256_unpacklo_epi8(hi, zero), p3 = _mm256_unpackhi_epi8(hi, zero);
      h0 = _mm256_add_epi32(h0, _mm256_madd_epi16(p0, wh));
      h1 = _mm256_add_epi32(h1, _mm256_madd_epi16(p1, wh));
      h2 = _mm256_add_epi32(h2, _mm256_madd_epi16(p2, wh));
      h3 = _mm256_add_epi32(h3, _mm256_madd_epi16(p3, wh));
      l0 = _mm256_add_epi32(l0, _mm256_madd_epi16(p0, wl));
      l1 = _mm256_add_epi32(l1, _mm256_madd_epi16(p1, wl));
      l2 = _mm256_add_epi32(l2, _mm256_madd_epi16(p2, wl));
      l3 = _mm256_add_epi32(l3, _mm256_madd_epi16(p3, wl));
    }
    const __m256i a0 = JoinSums(h0, l0), a1 = JoinSums(h1, l1);
    const __m256i a2 = JoinSums(h2, l2), a3 = JoinSums(h3, l3);
    // The per-lane unpacks above and the per-lane packs here cancel out:
    // the bytes come back in order.
    const __m256i out = _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), out);
  }
  VerticalRowScalar(rows, k, count, i, bytes, dst);
}
#endif  // TUTTI_RESAMPLE_AVX2

// ---- one row of each pass ----

// The horizontal filter with what its kernel needs, built once per image.
class Horizontal {
 public:
  Horizontal(const AxisFilter& f, bool simd) : f_(f) {
#if TUTTI_RESAMPLE_AVX2
    simd_ = simd && HaveAvx2();
    if (simd_) blocks_ = PackByteBlocks(f_);
    if (simd_ && blocks_.start.empty()) packed_ = PackHorizontal(f_);
#else
    (void)simd;
#endif
  }
  void Row(const uint8_t* src, uint8_t* dst) const {
#if TUTTI_RESAMPLE_AVX2
    if (simd_ && !blocks_.start.empty()) {
      HorizontalRowBlocksAvx2(src, dst, f_, blocks_);
      return;
    }
    if (simd_) {
      HorizontalRowAvx2(src, dst, f_, packed_);
      return;
    }
#endif
    HorizontalRowScalar(src, dst, f_, 0, f_.out_size);
  }

 private:
  const AxisFilter& f_;
  bool simd_ = false;
#if TUTTI_RESAMPLE_AVX2
  ByteBlocks blocks_;  // used when not empty
  PackedHorizontal packed_;
#endif
};

// Output row y of the vertical filter over `bytes` bytes of the rows it reads.
void VerticalRow(const AxisFilter& f, int y, const uint8_t* const* rows, size_t bytes, bool simd,
                 uint8_t* dst) {
  const int32_t* k = f.weights.data() + static_cast<size_t>(y) * f.taps;
#if TUTTI_RESAMPLE_AVX2
  if (simd && HaveAvx2()) {
    VerticalRowAvx2(rows, k, f.count[y], bytes, dst);
    return;
  }
#endif
  (void)simd;
  VerticalRowScalar(rows, k, f.count[y], 0, bytes, dst);
}

}  // namespace

AxisFilter MakeBicubicFilter(int in_size, int out_size) {
  assert(in_size > 0 && out_size > 0);
  AxisFilter f;
  f.in_size = in_size;
  f.out_size = out_size;
  // PIL's precompute_coeffs over the box (0, in_size), expression for
  // expression, so that every double and so every rounded weight is PIL's
  // (the box's bounds are floats there). Built with -ffp-contract=off: a
  // fused multiply-add would round differently.
  const float in0 = 0.0f, in1 = static_cast<float>(in_size);
  const double scale = static_cast<double>(in1 - in0) / out_size;
  const double filterscale = std::max(scale, 1.0);  // the kernel widens only when shrinking
  const double support = 2.0 * filterscale;         // the bicubic kernel's support is 2
  const double ss = 1.0 / filterscale;
  f.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  f.first.resize(out_size);
  f.count.resize(out_size);
  f.weights.assign(static_cast<size_t>(out_size) * f.taps, 0);
  std::vector<double> k(f.taps);
  for (int x = 0; x < out_size; ++x) {
    const double center = in0 + (x + 0.5) * scale;
    // Truncation toward zero, then clamping, as PIL rounds the bounds.
    const int lo = std::max(static_cast<int>(center - support + 0.5), 0);
    const int hi = std::min(static_cast<int>(center + support + 0.5), in_size);
    const int n = std::max(hi - lo, 1);
    double ww = 0;
    for (int t = 0; t < n; ++t) {
      k[t] = Bicubic((t + lo - center + 0.5) * ss);
      ww += k[t];
    }
    // PIL's normalize_coeffs_8bpc: each weight over the sum, then to
    // kPrecision fractional bits, rounded half away from zero. The sum may be
    // a few units off 1 << kPrecision, as in PIL.
    int32_t* q = &f.weights[static_cast<size_t>(x) * f.taps];
    for (int t = 0; t < n; ++t) {
      if (ww != 0.0) k[t] /= ww;
      q[t] = k[t] < 0 ? static_cast<int32_t>(-0.5 + k[t] * (1 << kPrecision))
                      : static_cast<int32_t>(0.5 + k[t] * (1 << kPrecision));
      assert(q[t] > -(1 << (15 + kSplit)) && q[t] < (1 << (15 + kSplit)));  // WeightHigh fits
    }
    // Taps whose weight is zero (the kernel's support ends on them) cost a
    // multiply-add for nothing: drop them from both ends.
    int lead = 0;
    while (lead < n - 1 && q[lead] == 0) ++lead;
    int m = n - lead;
    while (m > 1 && q[lead + m - 1] == 0) --m;
    if (lead > 0) std::memmove(q, q + lead, sizeof(int32_t) * m);
    std::fill(q + m, q + f.taps, int32_t{0});
    f.first[x] = std::min(lo, in_size - 1) + lead;
    f.count[x] = m;
  }
  return f;
}

void ResampleBicubicStrips(const cv::Mat& src, int out_height, int out_width, int strip_rows,
                           absl::FunctionRef<void(const cv::Mat& strip, int first_row)> sink,
                           const ResampleOptions& options) {
  assert(src.type() == CV_8UC3 && out_height > 0 && out_width > 0 && strip_rows > 0);
  const bool horizontal = out_width != src.cols, vertical = out_height != src.rows;
  if (!horizontal && !vertical) {
    for (int y0 = 0; y0 < out_height; y0 += strip_rows) {
      sink(src.rowRange(y0, std::min(y0 + strip_rows, out_height)), y0);
    }
    return;
  }
  thread_local ImageBuffer strip_buffer, between_buffer;
  cv::Mat strip = strip_buffer.Allocate(std::min(strip_rows, out_height), out_width);
  const size_t out_bytes = size_t{3} * out_width;
  // Fills output rows [y0, y0 + n) of the strip with `row(y, dst)`, then hands it on.
  auto strips = [&](auto&& row) {
    for (int y0 = 0; y0 < out_height; y0 += strip.rows) {
      const int n = std::min(strip.rows, out_height - y0);
      for (int i = 0; i < n; ++i) row(y0 + i, strip.ptr<uint8_t>(i));
      sink(strip.rowRange(0, n), y0);
    }
  };
  if (!vertical) {
    const AxisFilter fh = MakeBicubicFilter(src.cols, out_width);
    const Horizontal h(fh, options.simd);
    strips([&](int y, uint8_t* dst) { h.Row(src.ptr<uint8_t>(y), dst); });
    return;
  }
  const AxisFilter fv = MakeBicubicFilter(src.rows, out_height);
  std::vector<const uint8_t*> rows(fv.taps);
  if (!horizontal) {
    strips([&](int y, uint8_t* dst) {
      for (int t = 0; t < fv.count[y]; ++t) rows[t] = src.ptr<uint8_t>(fv.first[y] + t);
      VerticalRow(fv, y, rows.data(), out_bytes, options.simd, dst);
    });
    return;
  }
  const AxisFilter fh = MakeBicubicFilter(src.cols, out_width);
  const Horizontal h(fh, options.simd);
  // PIL's order: source rows resampled horizontally (and rounded to 8 bits)
  // as the vertical pass first needs them, into a ring that holds every row
  // one output row reads.
  int ring = 1, end = 0;
  for (int y = 0; y < out_height; ++y) {
    end = std::max(end, fv.first[y] + fv.count[y]);
    ring = std::max(ring, end - fv.first[y]);
  }
  cv::Mat between = between_buffer.Allocate(ring, out_width);
  int done = fv.first[0];  // source rows before this one are resampled (or never needed)
  strips([&](int y, uint8_t* dst) {
    for (const int need = fv.first[y] + fv.count[y]; done < need; ++done) {
      h.Row(src.ptr<uint8_t>(done), between.ptr<uint8_t>(done % ring));
    }
    for (int t = 0; t < fv.count[y]; ++t) rows[t] = between.ptr<uint8_t>((fv.first[y] + t) % ring);
    VerticalRow(fv, y, rows.data(), out_bytes, options.simd, dst);
  });
}

void ResampleBicubic(const cv::Mat& src, int out_height, int out_width, cv::Mat* out,
                     const ResampleOptions& options) {
  assert(src.type() == CV_8UC3 && out_height > 0 && out_width > 0);
  if (out_width == src.cols && out_height == src.rows) {
    src.copyTo(*out);
    return;
  }
  out->create(out_height, out_width, CV_8UC3);
  ResampleBicubicStrips(
      src, out_height, out_width, 16,
      [&](const cv::Mat& strip, int y0) { strip.copyTo(out->rowRange(y0, y0 + strip.rows)); },
      options);
}

}  // namespace tutti::stager
