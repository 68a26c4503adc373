#include "services/stager/decode/codecs.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>

// jpeglib.h needs FILE and size_t first.
#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

#include "absl/strings/str_cat.h"

namespace tutti::stager {

void CodecWarnings::Add(absl::string_view message) {
  if (count++ == 0) first = std::string(message);
}

namespace {

// What the libraries' C callbacks record: plain data only, since they run
// inside C frames that a longjmp (never an exception) leaves.
struct CallbackLog {
  char error[256] = {0};
  char first_warning[256] = {0};
  int warnings = 0;

  void Warn(const char* text) {
    if (warnings++ == 0) std::snprintf(first_warning, sizeof(first_warning), "%.250s", text);
  }
  void CopyTo(CodecWarnings* w) const {
    if (w == nullptr || warnings == 0) return;
    w->Add(first_warning);
    w->count += warnings - 1;
  }
};

// Allocates the output without letting an exception into a C frame.
uint8_t* AllocateBgr(ImageBuffer* out, unsigned rows, unsigned cols) noexcept {
  if (rows == 0 || cols == 0 || rows > (1u << 16) || cols > (1u << 16)) return nullptr;
  try {
    return out->Allocate(static_cast<int>(rows), static_cast<int>(cols)).data;
  } catch (...) {
    return nullptr;
  }
}

enum RunResult { kOk, kLibraryError, kUnsupported, kNoMemory };

absl::Status ToStatus(RunResult r, absl::string_view name, absl::string_view format,
                      const CallbackLog& log) {
  switch (r) {
    case kOk:
      return absl::OkStatus();
    case kLibraryError:
      return absl::DataLossError(absl::StrCat(name, ": ", format, " data does not decode (",
                                              log.error, "); re-export the sample"));
    case kUnsupported:
      return absl::UnimplementedError(absl::StrCat(name, ": ", log.error));
    case kNoMemory:
      return absl::ResourceExhaustedError(absl::StrCat(name, ": no memory for the decoded image"));
  }
  return absl::InternalError("unreachable");
}

// ---- JPEG (libjpeg-turbo) ----

struct JpegErrors {
  jpeg_error_mgr mgr;  // first: libjpeg hands back a pointer to it
  std::jmp_buf jump;
  CallbackLog* log;
};

extern "C" void JpegErrorExit(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegErrors*>(c->err);
  (*c->err->format_message)(c, e->log->error);
  std::longjmp(e->jump, 1);
}

extern "C" void JpegEmitMessage(j_common_ptr c, int level) {
  if (level >= 0) return;  // trace messages
  auto* e = reinterpret_cast<JpegErrors*>(c->err);
  char text[JMSG_LENGTH_MAX];
  (*c->err->format_message)(c, text);
  e->log->Warn(text);
  ++c->err->num_warnings;
}

RunResult RunJpeg(const unsigned char* data, size_t size, int scale, ImageBuffer* out,
                  CallbackLog* log) {
  jpeg_decompress_struct cinfo;
  std::memset(&cinfo, 0, sizeof(cinfo));  // destroyable even if creating it fails
  JpegErrors errors;
  errors.log = log;
  cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = JpegErrorExit;
  errors.mgr.emit_message = JpegEmitMessage;
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return kLibraryError;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    std::snprintf(log->error, sizeof(log->error), "CMYK JPEG");
    jpeg_destroy_decompress(&cinfo);
    return kUnsupported;
  }
  cinfo.out_color_space = JCS_EXT_BGR;  // from YCbCr, RGB or grey alike
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(scale);
  jpeg_calc_output_dimensions(&cinfo);
  uint8_t* base = AllocateBgr(out, cinfo.output_height, cinfo.output_width);
  if (base == nullptr) {
    jpeg_destroy_decompress(&cinfo);
    return kNoMemory;
  }
  const size_t stride = size_t{3} * cinfo.output_width;
  jpeg_start_decompress(&cinfo);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW rows[16];
    const unsigned n = std::min(16u, cinfo.output_height - cinfo.output_scanline);
    for (unsigned i = 0; i < n; ++i) rows[i] = base + (cinfo.output_scanline + i) * stride;
    jpeg_read_scanlines(&cinfo, rows, n);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return kOk;
}

// ---- PNG (libpng) ----

struct PngSource {
  const unsigned char* data;
  size_t size;
  size_t pos;
  CallbackLog* log;
  std::jmp_buf jump;
};

extern "C" void PngError(png_structp png, png_const_charp message) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->log->error, sizeof(src->log->error), "libpng: %.200s", message);
  std::longjmp(src->jump, 1);
}

extern "C" void PngWarning(png_structp png, png_const_charp message) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  char text[256];
  std::snprintf(text, sizeof(text), "libpng warning: %.200s", message);
  src->log->Warn(text);
}

extern "C" void PngRead(png_structp png, png_bytep out, size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (n > src->size - src->pos) png_error(png, "the data ends inside a chunk");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

RunResult RunPng(PngSource* src, ImageBuffer* out) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, src, PngError, PngWarning);
  if (png == nullptr) return kNoMemory;
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return kNoMemory;
  }
  if (setjmp(src->jump)) {
    png_destroy_read_struct(&png, &info, nullptr);
    return kLibraryError;
  }
  png_set_read_fn(png, src, PngRead);
  png_read_info(png, info);
  png_uint_32 width = 0, height = 0;
  int depth = 0, color = 0;
  png_get_IHDR(png, info, &width, &height, &depth, &color, nullptr, nullptr, nullptr);
  // As PIL's convert("RGB") sees it: palette and grey expanded, 16 bits cut
  // to the high byte, alpha (and palette transparency) dropped, not blended.
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16) png_set_strip_16(png);
  if ((color & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS)) {
    png_set_strip_alpha(png);
  }
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  png_set_bgr(png);
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != size_t{3} * width) png_error(png, "unexpected row layout");
  uint8_t* base = AllocateBgr(out, height, width);
  if (base == nullptr) {
    png_destroy_read_struct(&png, &info, nullptr);
    return kNoMemory;
  }
  const size_t stride = size_t{3} * width;
  for (int pass = 0; pass < passes; ++pass) {
    for (png_uint_32 y = 0; y < height; ++y) png_read_row(png, base + y * stride, nullptr);
  }
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return kOk;
}

}  // namespace

absl::Status DecodeJpeg(absl::string_view bytes, absl::string_view name, int scale, ImageBuffer* out,
                        CodecWarnings* warnings) {
  CallbackLog log;
  const RunResult r =
      RunJpeg(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), scale, out, &log);
  log.CopyTo(warnings);
  return ToStatus(r, name, "JPEG", log);
}

absl::Status DecodePng(absl::string_view bytes, absl::string_view name, ImageBuffer* out,
                       CodecWarnings* warnings) {
  CallbackLog log;
  PngSource src{reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), 0, &log, {}};
  const RunResult r = RunPng(&src, out);
  log.CopyTo(warnings);
  return ToStatus(r, name, "PNG", log);
}

absl::Status DecodeWebp(absl::string_view bytes, absl::string_view name, ImageBuffer* out) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  WebPBitstreamFeatures features;
  if (WebPGetFeatures(data, bytes.size(), &features) != VP8_STATUS_OK) {
    return absl::DataLossError(
        absl::StrCat(name, ": WebP data does not decode (bad header); re-export the sample"));
  }
  if (features.has_animation) {
    return absl::DataLossError(absl::StrCat(
        name, ": animated WebP; re-export the sample as a still image"));
  }
  uint8_t* base = AllocateBgr(out, static_cast<unsigned>(features.height),
                              static_cast<unsigned>(features.width));
  if (base == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(name, ": no memory for the decoded image"));
  }
  const size_t stride = size_t{3} * static_cast<unsigned>(features.width);
  if (WebPDecodeBGRInto(data, bytes.size(), base, stride * static_cast<unsigned>(features.height),
                        static_cast<int>(stride)) == nullptr) {
    return absl::DataLossError(
        absl::StrCat(name, ": WebP data does not decode (corrupt); re-export the sample"));
  }
  return absl::OkStatus();
}

}  // namespace tutti::stager
