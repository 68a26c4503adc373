#include "services/stager/decode/patchify.h"

#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tutti::stager {

PatchifyParams PatchifyParams::FromConfig(const v1::VisionConfig& v) {
  PatchifyParams p;
  if (v.patch_size()) p.patch = v.patch_size();
  if (v.merge_size()) p.merge = v.merge_size();
  if (v.temporal_patch()) p.temporal = v.temporal_patch();
  for (int c = 0; c < 3; ++c) {
    if (v.mean_size() == 3) p.mean[c] = v.mean(c);
    if (v.std_size() == 3) p.std[c] = v.std(c);
  }
  p.bf16 = v.output_dtype() == v1::DTYPE_BFLOAT16;
  if (v.max_source_pixels()) p.max_source_pixels = v.max_source_pixels();
  if (v.max_source_side()) p.max_source_side = v.max_source_side();
  p.resize = v.resize() == v1::RESIZE_FAST ? ResizeMode::kFast : ResizeMode::kHfBicubic;
  return p;
}

size_t PatchifyParams::ImageBytes(uint32_t height, uint32_t width) const {
  const size_t patches = size_t{height / patch} * (width / patch);
  return patches * row_values() * value_bytes();
}

uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

float Bf16ToFloat(uint16_t b) {
  uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

namespace {

// Per-channel tables from an 8-bit value to its normalised output value,
// built once per (mean, std, dtype).
template <typename T>
struct Lut {
  T v[3][256];
};

template <typename T>
T ToOut(float f);
template <>
inline float ToOut<float>(float f) {
  return f;
}
template <>
inline uint16_t ToOut<uint16_t>(float f) {
  return FloatToBf16(f);
}

template <typename T>
const Lut<T>& LutFor(const PatchifyParams& p) {
  // One table per thread, rebuilt only when the normalisation changes.
  thread_local Lut<T> lut;
  thread_local float key[6];
  thread_local bool built = false;
  if (!built || std::memcmp(key, p.mean, sizeof(p.mean)) != 0 ||
      std::memcmp(key + 3, p.std, sizeof(p.std)) != 0) {
    built = true;
    for (int c = 0; c < 3; ++c) {
      // As HF's processor: rescaled in float64, cast to float32, normalised in float32.
      for (int i = 0; i < 256; ++i) {
        const float scaled = static_cast<float>(i * (1.0 / 255.0));
        lut.v[c][i] = ToOut<T>((scaled - p.mean[c]) / p.std[c]);
      }
    }
    std::memcpy(key, p.mean, sizeof(p.mean));
    std::memcpy(key + 3, p.std, sizeof(p.std));
  }
  return lut;
}

// Copies whole 16-byte units with non-temporal stores when the destination
// is aligned: the output is read next by the trainer, not by this core, so
// it should not evict the decoder's working set (nor be read for ownership).
inline void StreamCopy(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0 && (bytes & 15) == 0) {
    auto* d = static_cast<__m128i*>(dst);
    const auto* s = static_cast<const __m128i*>(src);
    for (size_t i = 0; i < bytes / 16; ++i) _mm_stream_si128(d + i, _mm_loadu_si128(s + i));
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

// Normalises an 8-bit BGR image of exactly (H, W) through the tables and
// writes it in patch order, sequentially: each (channel, frame) block of a
// patch row is built once in a small buffer and stored `temporal` times.
template <typename T>
void PatchifyT(const cv::Mat& src, const PatchifyParams& p, T* out) {
  const Lut<T>& lut = LutFor<T>(p);
  const uint32_t P = p.patch, M = p.merge, Tt = p.temporal;
  const uint32_t gh = static_cast<uint32_t>(src.rows) / P, gw = static_cast<uint32_t>(src.cols) / P;
  const size_t plane = size_t{P} * P;  // one (channel, frame) block of a patch row
  std::vector<T> block(plane);
  T* d = out;
  for (uint32_t gy = 0; gy < gh / M; ++gy) {
    for (uint32_t gx = 0; gx < gw / M; ++gx) {
      for (uint32_t mh = 0; mh < M; ++mh) {
        for (uint32_t mw = 0; mw < M; ++mw) {
          const uint32_t y0 = (gy * M + mh) * P, x0 = (gx * M + mw) * P;
          for (uint32_t c = 0; c < 3; ++c) {
            const T* table = lut.v[c];
            for (uint32_t py = 0; py < P; ++py) {
              const uint8_t* s = src.ptr<uint8_t>(static_cast<int>(y0 + py)) + size_t{x0} * 3 + (2 - c);
              T* b = block.data() + size_t{py} * P;
              for (uint32_t x = 0; x < P; ++x) b[x] = table[s[3 * x]];  // BGR -> RGB
            }
            for (uint32_t t = 0; t < Tt; ++t, d += plane) StreamCopy(d, block.data(), plane * sizeof(T));
          }
        }
      }
    }
  }
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

#if defined(__x86_64__)
bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}

// pshufb masks gathering channel k (0 = B, 1 = G, 2 = R) of 16 BGR pixels
// from the three 16-byte chunks that hold them: [k][chunk].
struct Deinterleave {
  alignas(16) int8_t mask[3][3][16];
  Deinterleave() {
    for (int k = 0; k < 3; ++k) {
      for (int chunk = 0; chunk < 3; ++chunk) {
        for (int i = 0; i < 16; ++i) {
          const int pos = 3 * i + k;
          mask[k][chunk][i] = static_cast<int8_t>(pos / 16 == chunk ? pos % 16 : -1);
        }
      }
    }
  }
};

// The normalisation of 8 values, exactly as the tables hold them:
// float(i) / 255 is the float of i / 255 that HF's float64 rescale rounds to,
// then (x - mean) / std in float32.
struct Divide {
  __m256 mean, std;
  __attribute__((target("avx2"))) Divide(float m, float s)
      : mean(_mm256_set1_ps(m)), std(_mm256_set1_ps(s)) {}
  __attribute__((target("avx2"))) __m256 operator()(__m256 a) const {
    return _mm256_div_ps(_mm256_sub_ps(_mm256_div_ps(a, _mm256_set1_ps(255.0f)), mean), std);
  }
};

// The same two divisions as a multiply by the reciprocal corrected once by
// its exact residual (fma(-q, d, n) is exact): correctly rounded like a
// division for all but rare operands, far cheaper than one. Used only when
// it gives every table value exactly (FmaMatchesTables), so the output is
// the same.
struct FmaDivide {
  __m256 mean, std, inv_std, k255, inv255;
  __attribute__((target("avx2,fma"))) FmaDivide(float m, float s)
      : mean(_mm256_set1_ps(m)),
        std(_mm256_set1_ps(s)),
        inv_std(_mm256_set1_ps(1.0f / s)),
        k255(_mm256_set1_ps(255.0f)),
        inv255(_mm256_set1_ps(1.0f / 255.0f)) {}
  __attribute__((target("avx2,fma"))) static __m256 Div(__m256 n, __m256 d, __m256 inv) {
    const __m256 q = _mm256_mul_ps(n, inv);
    return _mm256_fmadd_ps(_mm256_fnmadd_ps(q, d, n), inv, q);
  }
  __attribute__((target("avx2,fma"))) __m256 operator()(__m256 a) const {
    return Div(_mm256_sub_ps(Div(a, k255, inv255), mean), std, inv_std);
  }
};

// 16 normalised values from 16 bytes.
template <typename Norm>
__attribute__((target("avx2,fma"))) inline void Normalise16(__m128i v, const Norm& norm, __m256* lo,
                                                            __m256* hi) {
  *lo = norm(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)));
  *hi = norm(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))));
}

bool HaveFma() {
  static const bool have = __builtin_cpu_supports("fma");
  return have;
}

// Whether FmaDivide gives every value of the tables (all 256 bytes of each
// channel) bit for bit. Remembered per thread for the last normalisation.
__attribute__((target("avx2,fma"))) bool FmaMatchesTables(const PatchifyParams& p) {
  thread_local float key[6];
  thread_local bool known = false, matches = false;
  if (known && std::memcmp(key, p.mean, sizeof(p.mean)) == 0 &&
      std::memcmp(key + 3, p.std, sizeof(p.std)) == 0) {
    return matches;
  }
  const Lut<float>& lut = LutFor<float>(p);
  matches = true;
  for (int c = 0; c < 3 && matches; ++c) {
    const FmaDivide norm(p.mean[c], p.std[c]);
    for (int i = 0; i < 256 && matches; i += 8) {
      alignas(32) float got[8];
      _mm256_store_ps(got,
                      norm(_mm256_setr_ps(i, i + 1, i + 2, i + 3, i + 4, i + 5, i + 6, i + 7)));
      matches = std::memcmp(got, &lut.v[c][i], sizeof(got)) == 0;
    }
  }
  std::memcpy(key, p.mean, sizeof(p.mean));
  std::memcpy(key + 3, p.std, sizeof(p.std));
  known = true;
  return matches;
}

// StreamCopy with 32-byte stores where the destination allows (16-byte
// aligned, a multiple of 16 bytes): half the store instructions.
__attribute__((target("avx2"))) inline void StreamCopyAvx2(void* dst, const void* src,
                                                           size_t bytes) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if ((reinterpret_cast<uintptr_t>(d) & 15) != 0 || (bytes & 15) != 0) {
    std::memcpy(d, s, bytes);
    return;
  }
  if ((reinterpret_cast<uintptr_t>(d) & 31) != 0 && bytes >= 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(d),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
    d += 16;
    s += 16;
    bytes -= 16;
  }
  for (; bytes >= 32; d += 32, s += 32, bytes -= 32) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
  }
  if (bytes != 0) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(d),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  }
}

// Stores 16 values (the caller's buffer has room past the `patch` it keeps).
__attribute__((target("avx2"))) inline void Store16(float* d, __m256 lo, __m256 hi) {
  _mm256_storeu_ps(d, lo);
  _mm256_storeu_ps(d + 8, hi);
}

__attribute__((target("avx2"))) inline __m256i Bf16Bits(__m256 f) {
  // Round to nearest even, as FloatToBf16 does for finite values.
  const __m256i u = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)), 16);
}

__attribute__((target("avx2"))) inline void Store16(uint16_t* d, __m256 lo, __m256 hi) {
  const __m256i packed = _mm256_packus_epi32(Bf16Bits(lo), Bf16Bits(hi));  // lanes interleaved
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), _mm256_permute4x64_epi64(packed, 0xD8));
}

// PatchifyT with the three channels of a patch row deinterleaved and
// normalised 16 pixels at a time (patch <= 16).
template <typename T, typename Norm>
__attribute__((target("avx2,fma"))) void PatchifyAvx2(const cv::Mat& src, const PatchifyParams& p,
                                                      T* out) {
  static const Deinterleave kSplit;
  const uint32_t P = p.patch, M = p.merge, Tt = p.temporal;
  const uint32_t gh = static_cast<uint32_t>(src.rows) / P, gw = static_cast<uint32_t>(src.cols) / P;
  const size_t plane = size_t{P} * P;
  const size_t row_bytes = size_t{3} * src.cols;
  alignas(32) T block[3][16 * 16 + 16];
  __m128i masks[3][3];
  const Norm norm[3] = {Norm(p.mean[0], p.std[0]), Norm(p.mean[1], p.std[1]),
                        Norm(p.mean[2], p.std[2])};
  for (int k = 0; k < 3; ++k) {
    for (int chunk = 0; chunk < 3; ++chunk) {
      masks[k][chunk] = _mm_load_si128(reinterpret_cast<const __m128i*>(kSplit.mask[k][chunk]));
    }
  }
  alignas(16) uint8_t edge[48] = {0};
  T* d = out;
  for (uint32_t gy = 0; gy < gh / M; ++gy) {
    for (uint32_t gx = 0; gx < gw / M; ++gx) {
      for (uint32_t mh = 0; mh < M; ++mh) {
        for (uint32_t mw = 0; mw < M; ++mw) {
          const uint32_t y0 = (gy * M + mh) * P, x0 = (gx * M + mw) * P;
          for (uint32_t py = 0; py < P; ++py) {
            const uint8_t* s = src.ptr<uint8_t>(static_cast<int>(y0 + py)) + size_t{x0} * 3;
            if (size_t{x0} * 3 + 48 > row_bytes) {  // 48 bytes would leave the row
              std::memcpy(edge, s, size_t{3} * P);
              s = edge;
            }
            const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
            const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
            const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
            for (int ch = 0; ch < 3; ++ch) {
              const int k = 2 - ch;  // RGB out of BGR
              const __m128i v = _mm_or_si128(
                  _mm_or_si128(_mm_shuffle_epi8(a, masks[k][0]), _mm_shuffle_epi8(b, masks[k][1])),
                  _mm_shuffle_epi8(c, masks[k][2]));
              __m256 lo, hi;
              Normalise16(v, norm[ch], &lo, &hi);
              Store16(block[ch] + size_t{py} * P, lo, hi);
            }
          }
          for (int ch = 0; ch < 3; ++ch) {
            for (uint32_t t = 0; t < Tt; ++t, d += plane) {
              StreamCopyAvx2(d, block[ch], plane * sizeof(T));
            }
          }
        }
      }
    }
  }
  _mm_sfence();
}
#endif  // __x86_64__

}  // namespace

void Patchify(const cv::Mat& bgr, const PatchifyParams& params, char* out, bool simd) {
#if defined(__x86_64__)
  // (Every CPU with AVX2 has FMA; the loop is compiled for both.)
  if (simd && params.patch <= 16 && HaveAvx2() && HaveFma()) {
    const bool fma = FmaMatchesTables(params);
    if (params.bf16) {
      auto* o = reinterpret_cast<uint16_t*>(out);
      fma ? PatchifyAvx2<uint16_t, FmaDivide>(bgr, params, o)
          : PatchifyAvx2<uint16_t, Divide>(bgr, params, o);
    } else {
      auto* o = reinterpret_cast<float*>(out);
      fma ? PatchifyAvx2<float, FmaDivide>(bgr, params, o)
          : PatchifyAvx2<float, Divide>(bgr, params, o);
    }
    return;
  }
#endif
  (void)simd;
  if (params.bf16) {
    PatchifyT<uint16_t>(bgr, params, reinterpret_cast<uint16_t*>(out));
  } else {
    PatchifyT<float>(bgr, params, reinterpret_cast<float*>(out));
  }
}

}  // namespace tutti::stager
