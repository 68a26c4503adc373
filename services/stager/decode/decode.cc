#include "services/stager/decode/decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "services/stager/decode/codecs.h"
#include "services/stager/decode/resample.h"
#include "services/stager/decode/skip.h"

namespace tutti::stager {

static const Logger kLog("stager.decode");

namespace {

absl::Status CheckTarget(uint32_t height, uint32_t width, const PatchifyParams& p) {
  const uint32_t factor = p.patch * p.merge;
  if (height == 0 || width == 0 || height % factor != 0 || width % factor != 0) {
    return absl::InvalidArgumentError(absl::StrCat("target size ", width, "x", height,
                                                   " is not a non-zero multiple of patch*merge = ",
                                                   factor, "; the plan and the vision config disagree"));
  }
  return absl::OkStatus();
}

// Refuses data that was cut off. The decoders do not: libjpeg fills a
// truncated scan with grey and only warns, libpng and libwebp may return the
// rows they got. Each format has a cheap end marker to insist on.
absl::Status CheckComplete(absl::string_view bytes, absl::string_view name, ImageKind kind) {
  const absl::string_view tail = bytes.substr(bytes.size() - std::min<size_t>(bytes.size(), 4096));
  switch (kind) {
    case ImageKind::kJpeg:
      if (tail.find("\xFF\xD9") == absl::string_view::npos) {
        return TruncatedError(absl::StrCat(name, ": truncated JPEG (", bytes.size(),
                                                " bytes, no end-of-image marker); re-export the sample"));
      }
      break;
    case ImageKind::kPng:
      // The IEND chunk (length 0, type, CRC) closes every PNG.
      if (tail.find(absl::string_view("IEND\xAE\x42\x60\x82", 8)) == absl::string_view::npos) {
        return TruncatedError(absl::StrCat(name, ": truncated PNG (", bytes.size(),
                                                " bytes, no IEND chunk); re-export the sample"));
      }
      break;
    case ImageKind::kWebp: {
      // RIFF size field: bytes after the first 8.
      const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
      const uint64_t riff = uint64_t{u[4]} | uint64_t{u[5]} << 8 | uint64_t{u[6]} << 16 |
                            uint64_t{u[7]} << 24;
      if (bytes.size() < riff + 8) {
        return TruncatedError(absl::StrCat(name, ": truncated WebP (", bytes.size(),
                                                " bytes, the RIFF header declares ", riff + 8,
                                                "); re-export the sample"));
      }
      break;
    }
    default:
      break;
  }
  return absl::OkStatus();
}

// Reads and checks the header: format from the magic bytes, size within limits.
absl::StatusOr<ImageHeader> CheckHeader(absl::string_view bytes, absl::string_view name,
                                        const PatchifyParams& p) {
  if (bytes.empty()) {
    return absl::DataLossError(absl::StrCat(name, ": image is empty (0 bytes); re-export the sample"));
  }
  auto header = ReadImageHeader(bytes);
  if (!header.ok()) {
    return absl::DataLossError(absl::StrCat(name, ": not a readable JPEG/PNG/WebP image (",
                                            header.status().message(), "); re-export the sample"));
  }
  RETURN_IF_ERROR(CheckComplete(bytes, name, header->kind));
  if (!WithinSourceLimits(header->width, header->height, p.max_source_pixels, p.max_source_side)) {
    return absl::OutOfRangeError(absl::StrCat(
        name, ": header declares ", header->width, "x", header->height,
        " pixels, over the limit (vision.max_source_pixels ", p.max_source_pixels,
        ", vision.max_source_side ", p.max_source_side, "); refused without decoding"));
  }
  return *header;
}

// An OpenCV error as a Status naming the image: out of memory is
// RESOURCE_EXHAUSTED, anything else DATA_LOSS (the image is what failed).
absl::Status FromCvException(const cv::Exception& e, absl::string_view name, absl::string_view what) {
  const std::string why = absl::StrCat(name, ": ", what, " failed in OpenCV: ", e.what());
  if (e.code == cv::Error::StsNoMem) return absl::ResourceExhaustedError(why);
  return absl::DataLossError(absl::StrCat(why, "; re-export the sample"));
}

// cv::imdecode, its exceptions as a Status (an empty image means the
// decoder refused the data without throwing).
absl::StatusOr<cv::Mat> Imdecode(absl::string_view bytes, int flags, absl::string_view name) {
  cv::Mat buf(1, static_cast<int>(bytes.size()), CV_8U, const_cast<char*>(bytes.data()));
  try {
    return cv::imdecode(buf, flags | cv::IMREAD_IGNORE_ORIENTATION);
  } catch (const cv::Exception& e) {
    return FromCvException(e, name, "decoding");
  }
}

int ReducedFlag(int reduce) {
  switch (reduce) {
    case 2: return cv::IMREAD_REDUCED_COLOR_2;
    case 4: return cv::IMREAD_REDUCED_COLOR_4;
    case 8: return cv::IMREAD_REDUCED_COLOR_8;
    default: return cv::IMREAD_COLOR;
  }
}

// How much shrink the bicubic filter must still have after a DCT scaling
// for HF parity: the scaled decode keeps frequencies the bicubic kernel
// would have damped, and only a kernel stretched this far damps them again
// (measured on Debian's wallpaper photographs: median PSNR against PIL's
// full decode and resize 53-57 dB at this margin, falling towards 40 dB as
// the margin goes to 1).
constexpr double kHfReduceMargin = 1.75;

// Largest DCT scale (8, 4, 2) the target allows. HF mode: the decoded image
// stays kHfReduceMargin times the target on both sides. Fast mode: at least
// 90% of the target (a few percent of upsampling after the DCT's own area
// averaging costs nothing visible and saves most of the decode).
int ChooseReduce(const ImageHeader& h, uint32_t height, uint32_t width, const PatchifyParams& p) {
  if (!p.reduced_jpeg || h.kind != ImageKind::kJpeg) return 1;
  for (int s : {8, 4, 2}) {
    const double w = (h.width + s - 1) / s, hh = (h.height + s - 1) / s;
    const bool fits = p.resize == ResizeMode::kHfBicubic
                          ? w >= kHfReduceMargin * width && hh >= kHfReduceMargin * height
                          : 10 * w >= 9.0 * width && 10 * hh >= 9.0 * height;
    if (fits) return s;
  }
  return 1;
}

// OpenCV's decoders: for what the direct codecs leave (CMYK JPEGs).
absl::StatusOr<cv::Mat> DecodeWithOpenCv(absl::string_view bytes, absl::string_view name,
                                         int reduce, const ImageHeader& header) {
  ASSIGN_OR_RETURN(cv::Mat img, Imdecode(bytes, ReducedFlag(reduce), name));
  if (img.empty()) {
    return absl::DataLossError(absl::StrCat(name, ": ", ImageKindName(header.kind), " data of ",
                                            bytes.size(), " bytes (", header.width, "x",
                                            header.height,
                                            ") does not decode: corrupt or truncated; re-export the sample"));
  }
  if (img.type() != CV_8UC3) {
    cv::Mat conv;
    try {
      if (img.channels() == 1) {
        cv::cvtColor(img, conv, cv::COLOR_GRAY2BGR);
      } else if (img.channels() == 4) {
        cv::cvtColor(img, conv, cv::COLOR_BGRA2BGR);
      } else {
        img.convertTo(conv, CV_8UC3);
      }
    } catch (const cv::Exception& e) {
      return FromCvException(e, name, "colour conversion");
    }
    img = conv;
  }
  return img;
}

// Decodes with the codec libraries directly (codecs.h); their warnings are
// logged with the image's name (rate-limited) and counted in `info`. The
// image lives in a per-thread buffer that the next decode on this thread
// reuses.
absl::StatusOr<cv::Mat> Decode(absl::string_view bytes, absl::string_view name, int reduce,
                               const ImageHeader& header, DecodeInfo* info) {
  thread_local ImageBuffer reused;
  ImageBuffer* out = &reused;
  CodecWarnings warnings;
  absl::Status s;
  switch (header.kind) {
    case ImageKind::kJpeg:
      s = DecodeJpeg(bytes, name, reduce, out, &warnings);
      break;
    case ImageKind::kPng:
      s = DecodePng(bytes, name, out, &warnings);
      break;
    case ImageKind::kWebp:
      s = DecodeWebp(bytes, name, out);
      break;
    default:
      s = absl::UnimplementedError("no direct codec");
      break;
  }
  if (warnings.count > 0) {
    if (info != nullptr) info->warnings += warnings.count;
    static LogRateLimit limit(absl::Seconds(10), 5);
    if (uint64_t suppressed = 0; limit.Allow(&suppressed)) {
      kLog.Warning("image decoder warning", {{"image", name},
                                             {"warning", warnings.first},
                                             {"count", warnings.count},
                                             {"suppressed", suppressed}});
    }
  }
  if (absl::IsUnimplemented(s)) return DecodeWithOpenCv(bytes, name, reduce, header);
  RETURN_IF_ERROR(s);
  return out->image();
}

// The fast resize to exactly (H, W): an integer area shrink first when more
// than 2x remains (so bilinear sampling does not alias), then bilinear.
void FastResizeTo(const cv::Mat& src_in, uint32_t H, uint32_t W, cv::Mat* out) {
  cv::Mat src = src_in;
  const int k = static_cast<int>(std::min(src.cols / (2.0 * W), src.rows / (2.0 * H)));
  thread_local cv::Mat shrunk;
  if (k >= 2) {
    cv::Mat cropped = src(cv::Rect(0, 0, src.cols / k * k, src.rows / k * k));
    cv::resize(cropped, shrunk, cv::Size(cropped.cols / k, cropped.rows / k), 0, 0, cv::INTER_AREA);
    src = shrunk;
  }
  if (src.cols == static_cast<int>(W) && src.rows == static_cast<int>(H)) {
    *out = src;
    return;
  }
  cv::resize(src, *out, cv::Size(static_cast<int>(W), static_cast<int>(H)), 0, 0, cv::INTER_LINEAR);
}

}  // namespace

absl::Status ResizePatchifyInto(const cv::Mat& bgr, uint32_t height, uint32_t width,
                                const PatchifyParams& params, char* out) {
  RETURN_IF_ERROR(CheckTarget(height, width, params));
  try {
    if (bgr.cols == static_cast<int>(width) && bgr.rows == static_cast<int>(height)) {
      Patchify(bgr, params, out);
    } else if (params.resize == ResizeMode::kHfBicubic) {
      // One row of merge groups at a time, resized and patchified while it
      // is still in cache: the output of a strip of patch*merge rows is
      // contiguous (rows of patches ordered by merge group).
      const int strip_rows = static_cast<int>(params.patch * params.merge);
      const size_t strip_bytes = params.ImageBytes(params.patch * params.merge, width);
      ResampleBicubicStrips(bgr, static_cast<int>(height), static_cast<int>(width), strip_rows,
                            [&](const cv::Mat& strip, int y0) {
                              Patchify(strip, params, out + y0 / strip_rows * strip_bytes);
                            });
    } else {
      thread_local ImageBuffer tile_buffer;
      cv::Mat tile = tile_buffer.Allocate(static_cast<int>(height), static_cast<int>(width));
      FastResizeTo(bgr, height, width, &tile);
      Patchify(tile, params, out);
    }
  } catch (const cv::Exception& e) {
    return FromCvException(e, "image", "resizing");
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<cv::Mat> DecodeForTargetUnchecked(absl::string_view bytes, absl::string_view name,
                                                 ImageKind declared, uint32_t height,
                                                 uint32_t width, const PatchifyParams& params,
                                                 DecodeInfo* info) {
  RETURN_IF_ERROR(CheckTarget(height, width, params));
  ASSIGN_OR_RETURN(ImageHeader header, CheckHeader(bytes, name, params));
  info->kind = header.kind;
  info->source_width = header.width;
  info->source_height = header.height;
  info->mislabelled = declared != ImageKind::kUnknown && declared != header.kind;
  info->reduce = ChooseReduce(header, height, width, params);
  return Decode(bytes, name, info->reduce, header, info);
}

absl::StatusOr<DecodeInfo> DecodeImageIntoUnchecked(absl::string_view bytes,
                                                    absl::string_view name, ImageKind declared,
                                                    uint32_t height, uint32_t width,
                                                    const PatchifyParams& params, char* out) {
  DecodeInfo info;
  ASSIGN_OR_RETURN(cv::Mat img,
                   DecodeForTargetUnchecked(bytes, name, declared, height, width, params, &info));
  RETURN_IF_ERROR(Annotate(ResizePatchifyInto(img, height, width, params, out), name));
  return info;
}

}  // namespace

absl::StatusOr<DecodeInfo> DecodeImageInto(absl::string_view bytes, absl::string_view name,
                                           ImageKind declared, uint32_t height, uint32_t width,
                                           const PatchifyParams& params, char* out) {
  try {
    return DecodeImageIntoUnchecked(bytes, name, declared, height, width, params, out);
  } catch (const cv::Exception& e) {
    return FromCvException(e, name, "decoding");
  }
}

absl::StatusOr<cv::Mat> DecodeForTarget(absl::string_view bytes, absl::string_view name,
                                        ImageKind declared, uint32_t height, uint32_t width,
                                        const PatchifyParams& params, DecodeInfo* info) {
  try {
    return DecodeForTargetUnchecked(bytes, name, declared, height, width, params, info);
  } catch (const cv::Exception& e) {
    return FromCvException(e, name, "decoding");
  }
}

}  // namespace tutti::stager
