// Normalisation and patchify: an 8-bit BGR image of the planned size into
// the vision encoder's input layout (Qwen2-VL convention), in one
// sequential pass over the output.
//
// Layout of an image of (height, width): one row per patch, rows ordered so
// each merge x merge group is contiguous (grid (gh/m, gw/m, m, m)); a row
// holds C x temporal x patch x patch values (channel-major, RGB, the frame
// repeated `temporal` times), each value (pixel/255 - mean[c]) / std[c]
// computed as HF's processor does (float32), stored as float32 or bfloat16.
#ifndef TUTTI_SERVICES_STAGER_DECODE_PATCHIFY_H_
#define TUTTI_SERVICES_STAGER_DECODE_PATCHIFY_H_

#include <cstddef>
#include <cstdint>

#include <opencv2/core.hpp>

#include "tutti/v1/job.pb.h"

namespace tutti::stager {

// How an image is resized to its planned size (vision.resize).
enum class ResizeMode {
  kHfBicubic,  // HF's Qwen2-VL processor: PIL's antialiased bicubic (default)
  kFast,       // deeper DCT scaling, integer area shrink, then bilinear
};

struct PatchifyParams {
  uint32_t patch = 14;
  uint32_t merge = 2;
  uint32_t temporal = 2;
  float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
  float std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
  bool bf16 = false;  // else float32
  // Headers larger than these are refused before decoding (decompression bombs).
  uint64_t max_source_pixels = 178956970;
  uint32_t max_source_side = 65500;
  // Use DCT-domain reduced JPEG decoding (1/2, 1/4, 1/8) when the target allows.
  bool reduced_jpeg = true;
  ResizeMode resize = ResizeMode::kHfBicubic;

  static PatchifyParams FromConfig(const v1::VisionConfig& vision);
  size_t row_values() const { return size_t{3} * temporal * patch * patch; }
  size_t value_bytes() const { return bf16 ? 2 : 4; }
  // Bytes of pixel_values for an image resized to (height, width).
  size_t ImageBytes(uint32_t height, uint32_t width) const;
};

// Writes `bgr` (CV_8UC3, exactly the planned size, both sides multiples of
// patch * merge) into `out` (ImageBytes(rows, cols)). Thread-safe. `simd`
// false runs the portable loop (the same values; for tests).
void Patchify(const cv::Mat& bgr, const PatchifyParams& params, char* out, bool simd = true);

// float -> bfloat16, round to nearest even.
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t b);

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_DECODE_PATCHIFY_H_
