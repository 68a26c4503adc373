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
  uint16_t format = 0;  // 1: integer PCM, 3: IEEE float (WAVE_FORMAT_EXTENSIBLE resolved)
  uint64_t frames = 0;  // samples per channel
  uint32_t duration_ms = 0;
  uint64_t data_offset = 0;  // the data chunk's samples, in the member
  uint64_t data_size = 0;
};

// Reads a RIFF/WAVE header: the one WAV parser, for the index and the
// stager's decoder alike. `bytes` is the member or its first bytes;
// `member_size` its whole size (0: bytes.size()). Accepts exactly what the
// decoder decodes: integer PCM of 8, 16, 24 or 32 bits and 32-bit float, with
// a block size of channels x bytes per sample, and a data chunk that lies
// within the member. DATA_LOSS naming what is wrong otherwise (also when the
// data chunk's header is past `bytes`: read more).
absl::StatusOr<AudioHeader> ReadWavHeader(absl::string_view bytes, uint64_t member_size = 0);

}  // namespace tutti

#endif  // TUTTI_COMMON_MEDIA_HEADER_H_
