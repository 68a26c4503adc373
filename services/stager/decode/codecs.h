// The image codecs, called directly: libjpeg-turbo, libpng and libwebp,
// with the settings PIL uses (JPEG: islow IDCT, fancy upsampling; PNG: 16
// bits cut to the high byte, palette and grey expanded, alpha dropped), so
// the 8-bit BGR pixels are the ones HF's processor starts from. The
// libraries' warnings ("Corrupt JPEG data", libpng's "iCCP: ...") are
// collected for the caller to attribute, never printed.
#ifndef TUTTI_SERVICES_STAGER_DECODE_CODECS_H_
#define TUTTI_SERVICES_STAGER_DECODE_CODECS_H_

#include <string>

#include <opencv2/core.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/stager/decode/image_buffer.h"

namespace tutti::stager {

// Warnings a decoder gave while the image still decoded.
struct CodecWarnings {
  int count = 0;
  std::string first;  // the first one's text
  void Add(absl::string_view message);
};

// Each decodes `bytes` (named `name` in messages) into an 8-bit BGR image
// in `out` (out->image() afterwards). DATA_LOSS with the library's message
// when the data does not decode; RESOURCE_EXHAUSTED when the image cannot be
// allocated.

// JPEG at 1/scale (1, 2, 4 or 8) in the DCT domain. UNIMPLEMENTED for CMYK
// and YCCK JPEGs (left to OpenCV's conversion).
absl::Status DecodeJpeg(absl::string_view bytes, absl::string_view name, int scale, ImageBuffer* out,
                        CodecWarnings* warnings);
absl::Status DecodePng(absl::string_view bytes, absl::string_view name, ImageBuffer* out,
                       CodecWarnings* warnings);
absl::Status DecodeWebp(absl::string_view bytes, absl::string_view name, ImageBuffer* out);

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_DECODE_CODECS_H_
