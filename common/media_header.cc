#include "common/media_header.h"

#include <webp/decode.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tutti {
namespace {

uint32_t Be16(const unsigned char* p) { return (uint32_t{p[0]} << 8) | p[1]; }
uint32_t Be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}
uint32_t Le16(const unsigned char* p) { return uint32_t{p[0]} | (uint32_t{p[1]} << 8); }
uint32_t Le24(const unsigned char* p) { return Le16(p) | (uint32_t{p[2]} << 16); }
uint32_t Le32(const unsigned char* p) { return Le24(p) | (uint32_t{p[3]} << 24); }

absl::StatusOr<ImageHeader> ReadJpeg(const unsigned char* p, size_t n) {
  size_t i = 2;  // after SOI
  while (i + 4 <= n) {
    if (p[i] != 0xFF) return absl::DataLossError(absl::StrCat("JPEG marker expected at byte ", i));
    while (i < n && p[i] == 0xFF) ++i;  // fill bytes
    if (i >= n) break;
    const unsigned char marker = p[i++];
    if (marker == 0xD8 || (marker >= 0xD0 && marker <= 0xD7) || marker == 0x01) continue;
    if (marker == 0xD9 || marker == 0xDA) {
      return absl::DataLossError("JPEG has no frame header before its scan data");
    }
    if (i + 2 > n) break;
    const uint32_t len = Be16(p + i);
    if (len < 2) return absl::DataLossError("JPEG segment with length < 2");
    const bool sof = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 &&
                     marker != 0xCC;
    if (sof) {
      if (i + 7 > n) break;
      ImageHeader h;
      h.kind = ImageKind::kJpeg;
      h.height = Be16(p + i + 3);
      h.width = Be16(p + i + 5);
      if (h.width == 0 || h.height == 0) {
        return absl::DataLossError("JPEG frame header declares an empty image");
      }
      return h;
    }
    i += len;
  }
  return absl::DataLossError("JPEG header truncated before its frame header");
}

absl::StatusOr<ImageHeader> ReadPng(const unsigned char* p, size_t n) {
  // 8-byte signature, then the IHDR chunk: length(4) "IHDR" width(4) height(4).
  if (n < 24) return absl::DataLossError("PNG truncated before IHDR");
  if (absl::string_view(reinterpret_cast<const char*>(p + 12), 4) != "IHDR") {
    return absl::DataLossError("PNG does not start with an IHDR chunk");
  }
  ImageHeader h;
  h.kind = ImageKind::kPng;
  h.width = Be32(p + 16);
  h.height = Be32(p + 20);
  if (h.width == 0 || h.height == 0 || h.width > 0x7FFFFFFF || h.height > 0x7FFFFFFF) {
    return absl::DataLossError(absl::StrCat("PNG IHDR declares invalid size ", h.width, "x", h.height));
  }
  return h;
}

absl::StatusOr<ImageHeader> ReadWebp(const unsigned char* p, size_t n) {
  if (n < 30) return absl::DataLossError("WebP truncated before its first chunk");
  absl::string_view fourcc(reinterpret_cast<const char*>(p + 12), 4);
  const unsigned char* c = p + 20;  // chunk payload
  ImageHeader h;
  h.kind = ImageKind::kWebp;
  if (fourcc == "VP8 ") {
    // frame tag (3) + start code 9d 01 2a + width(14 bits) + height(14 bits)
    if (c[3] != 0x9d || c[4] != 0x01 || c[5] != 0x2a) {
      return absl::DataLossError("WebP VP8 chunk has a bad start code");
    }
    h.width = Le16(c + 6) & 0x3FFF;
    h.height = Le16(c + 8) & 0x3FFF;
  } else if (fourcc == "VP8L") {
    if (c[0] != 0x2f) return absl::DataLossError("WebP VP8L chunk has a bad signature");
    const uint32_t bits = Le32(c + 1);
    h.width = (bits & 0x3FFF) + 1;
    h.height = ((bits >> 14) & 0x3FFF) + 1;
  } else if (fourcc == "VP8X") {
    h.width = Le24(c + 4) + 1;
    h.height = Le24(c + 7) + 1;
  } else {
    return absl::DataLossError(absl::StrCat("WebP has unknown first chunk '", fourcc, "'"));
  }
  if (h.width == 0 || h.height == 0) return absl::DataLossError("WebP declares an empty image");
  // The decoder (OpenCV through libwebp) takes the bytes for WebP only if
  // libwebp reads their bitstream header; otherwise cv::imdecode tries its
  // other decoders on them (the DICOM reader looks for "DICM" at byte 128).
  // So what libwebp refuses is corrupt here already.
  WebPBitstreamFeatures features;
  if (WebPGetFeatures(p, n, &features) != VP8_STATUS_OK) {
    return absl::DataLossError("WebP bitstream header is corrupt (libwebp refuses it)");
  }
  if (static_cast<uint32_t>(features.width) != h.width ||
      static_cast<uint32_t>(features.height) != h.height) {
    return absl::DataLossError(absl::StrCat("WebP container says ", h.width, "x", h.height,
                                            " but its bitstream ", features.width, "x",
                                            features.height));
  }
  return h;
}

}  // namespace

absl::StatusOr<ImageHeader> ReadImageHeader(absl::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  if (n == 0) return absl::DataLossError("image is empty (0 bytes)");
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return ReadJpeg(p, n);
  static constexpr unsigned char kPngSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (n >= 8 && std::equal(kPngSig, kPngSig + 8, p)) return ReadPng(p, n);
  if (n >= 12 && bytes.substr(0, 4) == "RIFF" && bytes.substr(8, 4) == "WEBP") return ReadWebp(p, n);
  return absl::InvalidArgumentError("not a JPEG, PNG or WebP image (unknown magic bytes)");
}

ImageKind ImageKindFromExtension(absl::string_view ext) {
  std::string e = absl::AsciiStrToLower(ext);
  if (e == "jpg" || e == "jpeg") return ImageKind::kJpeg;
  if (e == "png") return ImageKind::kPng;
  if (e == "webp") return ImageKind::kWebp;
  return ImageKind::kUnknown;
}

absl::string_view ImageKindName(ImageKind kind) {
  switch (kind) {
    case ImageKind::kJpeg: return "jpeg";
    case ImageKind::kPng: return "png";
    case ImageKind::kWebp: return "webp";
    default: return "unknown";
  }
}

absl::StatusOr<AudioHeader> ReadWavHeader(absl::string_view bytes, uint64_t member_size) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  if (member_size == 0) member_size = n;
  if (n < 12 || bytes.substr(0, 4) != "RIFF" || bytes.substr(8, 4) != "WAVE") {
    return absl::DataLossError("not a RIFF/WAVE file");
  }
  AudioHeader h;
  bool have_fmt = false;
  uint32_t block_align = 0;
  uint64_t i = 12;
  while (i + 8 <= n) {
    absl::string_view id = bytes.substr(i, 4);
    const uint32_t len = Le32(p + i + 4);
    const uint64_t body = i + 8;
    if (body + len > member_size) {
      return absl::DataLossError(absl::StrCat("WAV chunk '", absl::CHexEscape(id), "' of ", len,
                                              " bytes runs past the end of the ", member_size,
                                              "-byte file (truncated)"));
    }
    if (id == "fmt ") {
      if (len < 16 || body + 16 > n) return absl::DataLossError("WAV fmt chunk truncated");
      uint32_t format = Le16(p + body);
      if (format == 0xFFFE) {  // WAVE_FORMAT_EXTENSIBLE: the sub-format's first two bytes
        if (len < 26 || body + 26 > n) {
          return absl::DataLossError("WAV extensible fmt chunk truncated");
        }
        format = Le16(p + body + 24);
      }
      h.channels = static_cast<uint16_t>(Le16(p + body + 2));
      h.sample_rate = Le32(p + body + 4);
      block_align = Le16(p + body + 12);
      h.bits_per_sample = static_cast<uint16_t>(Le16(p + body + 14));
      const uint32_t bits = h.bits_per_sample;
      if (!((format == 1 && (bits == 8 || bits == 16 || bits == 24 || bits == 32)) ||
            (format == 3 && bits == 32))) {
        return absl::DataLossError(absl::StrCat(
            "WAV format ", format, " with ", bits,
            " bits per sample is not supported (integer PCM of 8/16/24/32 bits or 32-bit float)"));
      }
      if (h.channels == 0 || block_align != uint32_t{h.channels} * (bits / 8)) {
        return absl::DataLossError(absl::StrCat("WAV fmt chunk declares ", h.channels,
                                                " channels of ", bits, " bits in blocks of ",
                                                block_align, " bytes"));
      }
      h.format = static_cast<uint16_t>(format);
      have_fmt = true;
    } else if (id == "data") {
      if (!have_fmt) return absl::DataLossError("WAV data chunk before fmt chunk");
      if (h.sample_rate == 0) return absl::DataLossError("WAV fmt chunk declares a zero rate");
      h.frames = len / block_align;
      h.duration_ms = static_cast<uint32_t>(h.frames * 1000 / h.sample_rate);
      h.data_offset = body;
      h.data_size = len;
      return h;
    }
    i = body + len + (len & 1);
  }
  return absl::DataLossError(i + 8 <= member_size ? "WAV data chunk not within the bytes read"
                                                  : "WAV file has no data chunk");
}

}  // namespace tutti
