// Image and audio sizes read from file headers, without decoding pixels.
#ifndef TUTTI_COMMON_MEDIA_HEADER_H_
#define TUTTI_COMMON_MEDIA_HEADER_H_

#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace tutti {

enum class ImageKind { kUnknown = 0, kJpeg = 1, kPng = 2, kWebp = 3 };

struct ImageHeader {
  ImageKind kind = ImageKind::kUnknown;
  uint32_t width = 0;
  uint32_t height = 0;
};

// Detects the format from the magic bytes (not the file name) and reads the
// dimensions. DATA_LOSS for a truncated or corrupt header, INVALID_ARGUMENT
// for an unknown format.
absl::StatusOr<ImageHeader> ReadImageHeader(absl::string_view bytes);

// The format a member name's extension claims ("jpg", "jpeg", "png", "webp").
ImageKind ImageKindFromExtension(absl::string_view ext);

// Whether an image of width x height passes the decoder's size limits
// (vision.max_source_pixels, vision.max_source_side): the stager refuses a
// larger header without decoding it, so the packer never plans one.
inline bool WithinSourceLimits(uint64_t width, uint64_t height, uint64_t max_pixels,
                               uint64_t max_side) {
  return width <= max_side && height <= max_side && width * height <= max_pixels;
}
absl::string_view ImageKindName(ImageKind kind);

struct AudioHeader {
  uint32_t sample_rate = 0;
  uint16_t channels = 0;
  uint16_t bits_per_sample = 0;
  uint64_t frames = 0;  // samples per channel
  uint32_t duration_ms = 0;
};

// Reads a RIFF/WAVE header (PCM or IEEE float). DATA_LOSS when malformed.
absl::StatusOr<AudioHeader> ReadWavHeader(absl::string_view bytes);

}  // namespace tutti

#endif  // TUTTI_COMMON_MEDIA_HEADER_H_
