// Image decode, resize, normalisation and patchify into the vision encoder's
// input layout (Qwen2-VL convention). By default the pixels are HF's: the
// resize is PIL's antialiased bicubic (resample.h) on the decoded 8-bit
// image, and a JPEG is decoded at 1/2, 1/4 or 1/8 scale in the DCT domain
// only where the bicubic filter still has a large shrink left after it. The
// opt-in fast mode scales JPEGs as far as the target allows and resizes with
// an integer area shrink and bilinear. In the default mode the resize hands
// its rows on in strips of patch*merge rows, each normalised and patchified
// into its place in the output while still in cache; the output is written
// once, in order.
//
// Output layout of one image resized to (height, width): one row per patch,
// rows ordered so each merge x merge group is contiguous
// (grid (gh/m, gw/m, m, m)); a row holds C x temporal x patch x patch values
// (channel-major, RGB, the frame repeated `temporal` times), each value
// (pixel/255 - mean[c]) / std[c], stored as float32 or bfloat16.
#ifndef TUTTI_SERVICES_STAGER_DECODE_DECODE_H_
#define TUTTI_SERVICES_STAGER_DECODE_DECODE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include <opencv2/core.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/media_header.h"
#include "services/stager/decode/patchify.h"

namespace tutti::stager {

struct DecodeInfo {
  ImageKind kind = ImageKind::kUnknown;  // from the magic bytes
  uint32_t source_width = 0;
  uint32_t source_height = 0;
  int reduce = 1;            // 1, 2, 4 or 8 (JPEG DCT scaling used)
  bool mislabelled = false;  // the declared format differs from the content
  int warnings = 0;          // the codec's warnings (logged with the image's name)
};

// Decodes `bytes` (named `name` in messages), resizes to (height, width),
// normalises and writes the patches to `out` (ImageBytes(height, width)).
// Errors: DATA_LOSS for corrupt, truncated (JPEG without its end-of-image
// marker, PNG without IEND, WebP shorter than its RIFF size), empty or unknown data;
// OUT_OF_RANGE for dimensions over the limits (not decoded); INVALID_ARGUMENT
// for a target that is not a multiple of patch*merge; RESOURCE_EXHAUSTED when
// memory runs out. Every OpenCV error is caught here, its message kept.
absl::StatusOr<DecodeInfo> DecodeImageInto(absl::string_view bytes, absl::string_view name,
                                           ImageKind declared, uint32_t height, uint32_t width,
                                           const PatchifyParams& params, char* out);

// Only the decode step of DecodeImageInto for a (height, width) target: the
// 8-bit BGR image at the DCT scale it would choose, `info` filled in. Same
// errors as DecodeImageInto. The image lives in a per-thread buffer: valid
// until the next decode on this thread.
absl::StatusOr<cv::Mat> DecodeForTarget(absl::string_view bytes, absl::string_view name,
                                        ImageKind declared, uint32_t height, uint32_t width,
                                        const PatchifyParams& params, DecodeInfo* info);

// Resizes an 8-bit BGR image to (height, width) the way params.resize says,
// normalises and patchifies into `out` (one sequential pass over the
// output). An image already of that size is not resampled. Thread-safe;
// uses per-thread scratch buffers. INVALID_ARGUMENT for a target that is not
// a multiple of patch*merge; OpenCV's errors as in DecodeImageInto.
absl::Status ResizePatchifyInto(const cv::Mat& bgr, uint32_t height, uint32_t width,
                                const PatchifyParams& params, char* out);
}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_DECODE_DECODE_H_
