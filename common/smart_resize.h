// Qwen2-VL-style smart resize and the patch geometry it implies.
#ifndef TUTTI_COMMON_SMART_RESIZE_H_
#define TUTTI_COMMON_SMART_RESIZE_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace tutti {

struct VisionGeometryOptions {
  uint32_t patch_size = 14;
  uint32_t merge_size = 2;
  uint32_t temporal_patch = 2;
  uint64_t min_pixels = 3136;
  uint64_t max_pixels = 1003520;
  double max_aspect_ratio = 200.0;
};

struct ImageGeometry {
  uint32_t height = 0;  // after resize, a multiple of patch_size * merge_size
  uint32_t width = 0;
  uint32_t grid_t = 1;
  uint32_t grid_h = 0;  // height / patch_size
  uint32_t grid_w = 0;
  uint32_t patches = 0;     // grid_t * grid_h * grid_w
  uint32_t llm_tokens = 0;  // patches / merge_size^2
};

// Rounds (height, width) to multiples of factor = patch*merge, scaling so the
// area lies within [min_pixels, max_pixels]. Refuses empty images and aspect
// ratios above max_aspect_ratio with INVALID_ARGUMENT.
absl::StatusOr<ImageGeometry> SmartResize(uint32_t height, uint32_t width,
                                          const VisionGeometryOptions& opts);

}  // namespace tutti

#endif  // TUTTI_COMMON_SMART_RESIZE_H_
