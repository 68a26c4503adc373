// Antialiased bicubic resampling of 8-bit, 3-channel images: the filter of
// PIL's Image.resize(..., Image.BICUBIC), which HF's Qwen2-VL image processor
// applies before rescaling and normalising.
//
// The filter is separable. Along each axis an output sample at position x
// (pixel centres at x + 0.5) takes the input samples under the bicubic kernel
// (a = -0.5, support 2) centred at (x + 0.5) * scale, where scale =
// in / out. When shrinking, the kernel is stretched by the shrink factor, so
// its support widens to 2 * scale input samples and it low-passes what the
// output cannot hold (no aliasing); when enlarging, it is the plain 4-tap
// kernel. Weights are normalised per output sample (so edges are handled by
// renormalising, not by padding) and applied in fixed point; each pass rounds
// to 8 bits, as PIL does. An axis whose size does not change is not resampled
// (a same-size image is returned untouched).
//
// Exactly PIL's arithmetic (Pillow's ImagingResample): the kernel's bounds
// and weights computed in double as PIL computes them, weights rounded to 22
// fractional bits in int32, sums started at one half, shifted and clipped to
// 8 bits after each pass, and the horizontal pass first, then the vertical
// pass over its 8-bit rows. The other order is cheaper for large shrinks but
// rounds differently between the passes, up to 20 levels at sharp edges; it
// is not offered.
#ifndef TUTTI_SERVICES_STAGER_DECODE_RESAMPLE_H_
#define TUTTI_SERVICES_STAGER_DECODE_RESAMPLE_H_

#include <cstdint>
#include <opencv2/core.hpp>
#include <vector>

#include "absl/functional/function_ref.h"

namespace tutti::stager {

// Per-axis filter: which input samples each output sample reads and with
// which fixed-point weights.
struct AxisFilter {
  int in_size = 0;
  int out_size = 0;
  int taps = 0;            // weights stored per output sample (the widest support)
  std::vector<int> first;  // first input sample read by each output sample
  std::vector<int> count;  // input samples read by each output sample
  std::vector<int32_t>
      weights;  // out_size x taps, zero past count; sum about 1 << kResamplePrecision
};

// Fractional bits of the weights: PIL's PRECISION_BITS (32 - 8 - 2).
inline constexpr int kResamplePrecision = 22;

// The bicubic (a = -0.5) filter from in_size to out_size samples, widened by
// the shrink factor when in_size > out_size, with PIL's weights (precompute_coeffs
// and normalize_coeffs_8bpc with the whole axis as the box; taps of zero weight
// at either end dropped, which changes no sum). Both sizes must be positive.
AxisFilter MakeBicubicFilter(int in_size, int out_size);

struct ResampleOptions {
  // Use the AVX2 kernels when the CPU has them (the results are identical
  // either way; false runs the portable loops, for tests).
  bool simd = true;
};

// Resizes `src` (CV_8UC3, any stride) to out_height x out_width into `out`
// (reallocated as needed; must not alias src). Thread-safe; the
// intermediate image lives in a per-thread buffer.
void ResampleBicubic(const cv::Mat& src, int out_height, int out_width, cv::Mat* out,
                     const ResampleOptions& options = {});

// The same resize handed out in strips of `strip_rows` output rows (the
// last one shorter when out_height is not a multiple), top to bottom:
// sink(strip, first_row) for each, the strip valid only during the call. No
// whole intermediate or output image is built: the horizontal pass's rows
// live in a ring of as many rows as one output row reads, so a strip and the
// rows behind it stay in cache for the caller's next pass. Thread-safe; the
// buffers are per thread (a sink must not resample on the same thread).
void ResampleBicubicStrips(const cv::Mat& src, int out_height, int out_width, int strip_rows,
                           absl::FunctionRef<void(const cv::Mat& strip, int first_row)> sink,
                           const ResampleOptions& options = {});

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_DECODE_RESAMPLE_H_
