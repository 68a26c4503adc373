// Image decode, resize, normalisation and patchify into the vision encoder's
// input layout (Qwen2-VL convention). By default the pixels are HF's: the
// resize is PIL's antialiased bicubic (resample.h) on the decoded 8-bit
// image, and a JPEG is decoded at 1/2, 1/4 or 1/8 scale in the DCT domain
// only where the bicubic filter still has a large shrink left after it. The
// opt-in fast mode scales JPEGs as far as the target allows and resizes with
// an integer area shrink and bilinear. Normalisation and patchify are then
// one sequential pass over the output through per-channel lookup tables.
//
// Output layout of one image resized to (height, width): one row per patch,
// rows ordered so each merge x merge group is contiguous
// (grid (gh/m, gw/m, m, m)); a row holds C x temporal x patch x patch values
// (channel-major, RGB, the frame repeated `temporal` times), each value
// (pixel/255 - mean[c]) / std[c], stored as float32 or bfloat16.
#ifndef TUTTI_SERVICES_STAGER_DECODE_H_
#define TUTTI_SERVICES_STAGER_DECODE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include <opencv2/core.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/media_header.h"
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

struct DecodeInfo {
  ImageKind kind = ImageKind::kUnknown;  // from the magic bytes
  uint32_t source_width = 0;
  uint32_t source_height = 0;
  int reduce = 1;            // 1, 2, 4 or 8 (JPEG DCT scaling used)
  bool mislabelled = false;  // the declared format differs from the content
};

// Decodes `bytes` (named `name` in messages), resizes to (height, width),
// normalises and writes the patches to `out` (ImageBytes(height, width)).
// Errors: DATA_LOSS for corrupt, truncated (JPEG without its end-of-image
// marker, PNG without IEND, WebP shorter than its RIFF size), empty or unknown data;
// OUT_OF_RANGE for dimensions over the limits (not decoded); INVALID_ARGUMENT
// for a target that is not a multiple of patch*merge; RESOURCE_EXHAUSTED when
// memory runs out. Every OpenCV error is caught here, its message kept.
// `decoded`, if given, receives the decoded 8-bit BGR image (before the
// resize).
absl::StatusOr<DecodeInfo> DecodeImageInto(absl::string_view bytes, absl::string_view name,
                                           ImageKind declared, uint32_t height, uint32_t width,
                                           const PatchifyParams& params, char* out,
                                           cv::Mat* decoded = nullptr);

// Only the decode step of DecodeImageInto for a (height, width) target: the
// 8-bit BGR image at the DCT scale it would choose, `info` filled in. Same
// errors as DecodeImageInto.
absl::StatusOr<cv::Mat> DecodeForTarget(absl::string_view bytes, absl::string_view name,
                                        ImageKind declared, uint32_t height, uint32_t width,
                                        const PatchifyParams& params, DecodeInfo* info);

// Decodes to an 8-bit BGR image without resizing (used to keep substitutes),
// shrunk by DCT scaling / area so that no side exceeds max_side.
absl::StatusOr<cv::Mat> DecodeImageSmall(absl::string_view bytes, absl::string_view name,
                                         const PatchifyParams& params, uint32_t max_side);

// Resizes an 8-bit BGR image to (height, width) the way params.resize says,
// normalises and patchifies into `out` (one sequential pass over the
// output). An image already of that size is not resampled. Thread-safe;
// uses per-thread scratch buffers. INVALID_ARGUMENT for a target that is not
// a multiple of patch*merge; OpenCV's errors as in DecodeImageInto.
absl::Status ResizePatchifyInto(const cv::Mat& bgr, uint32_t height, uint32_t width,
                                const PatchifyParams& params, char* out);

// float -> bfloat16, round to nearest even.
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t b);

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_DECODE_H_
