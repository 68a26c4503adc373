#include "services/stager/decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tutti::stager {

PatchifyParams PatchifyParams::FromConfig(const v1::VisionConfig& v) {
  PatchifyParams p;
  if (v.patch_size()) p.patch = v.patch_size();
  if (v.merge_size()) p.merge = v.merge_size();
  if (v.temporal_patch()) p.temporal = v.temporal_patch();
  for (int c = 0; c < 3; ++c) {
    if (v.mean_size() == 3) p.mean[c] = v.mean(c);
    if (v.std_size() == 3) p.std[c] = v.std(c);
  }
  p.bf16 = v.output_dtype() == v1::DTYPE_BFLOAT16;
  if (v.max_source_pixels()) p.max_source_pixels = v.max_source_pixels();
  if (v.max_source_side()) p.max_source_side = v.max_source_side();
  return p;
}

size_t PatchifyParams::ImageBytes(uint32_t height, uint32_t width) const {
  const size_t patches = size_t{height / patch} * (width / patch);
  return patches * row_values() * value_bytes();
}

uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

float Bf16ToFloat(uint16_t b) {
  uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

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
  if (header->kind == ImageKind::kJpeg) {
    // libjpeg fills a cut-off scan with grey and only warns: insist on the
    // end-of-image marker near the end instead.
    const size_t tail = std::min<size_t>(bytes.size(), 4096);
    if (bytes.substr(bytes.size() - tail).find("\xFF\xD9") == absl::string_view::npos) {
      return absl::DataLossError(absl::StrCat(name, ": truncated JPEG (", bytes.size(),
                                              " bytes, no end-of-image marker); re-export the sample"));
    }
  }
  const uint64_t pixels = uint64_t{header->width} * header->height;
  if (header->width > p.max_source_side || header->height > p.max_source_side ||
      pixels > p.max_source_pixels) {
    return absl::OutOfRangeError(absl::StrCat(
        name, ": header declares ", header->width, "x", header->height,
        " pixels, over the limit (vision.max_source_pixels ", p.max_source_pixels,
        ", vision.max_source_side ", p.max_source_side, "); refused without decoding"));
  }
  return *header;
}

cv::Mat Imdecode(absl::string_view bytes, int flags) {
  cv::Mat buf(1, static_cast<int>(bytes.size()), CV_8U, const_cast<char*>(bytes.data()));
  try {
    return cv::imdecode(buf, flags | cv::IMREAD_IGNORE_ORIENTATION);
  } catch (const cv::Exception& e) {
    return cv::Mat();
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

// Largest DCT scale (8, 4, 2) whose decoded image is at least 90% of the
// target on both sides (a few percent of upsampling after the DCT's own
// area averaging costs nothing visible and saves most of the decode).
int ChooseReduce(const ImageHeader& h, uint32_t height, uint32_t width, const PatchifyParams& p) {
  if (!p.reduced_jpeg || h.kind != ImageKind::kJpeg) return 1;
  for (int s : {8, 4, 2}) {
    if (10 * ((h.width + s - 1) / s) >= 9 * width && 10 * ((h.height + s - 1) / s) >= 9 * height) {
      return s;
    }
  }
  return 1;
}

absl::StatusOr<cv::Mat> Decode(absl::string_view bytes, absl::string_view name, int reduce,
                               const ImageHeader& header) {
  cv::Mat img = Imdecode(bytes, ReducedFlag(reduce));
  if (img.empty()) {
    return absl::DataLossError(absl::StrCat(name, ": ", ImageKindName(header.kind), " data of ",
                                            bytes.size(), " bytes (", header.width, "x",
                                            header.height,
                                            ") does not decode: corrupt or truncated; re-export the sample"));
  }
  if (img.type() != CV_8UC3) {
    cv::Mat conv;
    if (img.channels() == 1) {
      cv::cvtColor(img, conv, cv::COLOR_GRAY2BGR);
    } else if (img.channels() == 4) {
      cv::cvtColor(img, conv, cv::COLOR_BGRA2BGR);
    } else {
      img.convertTo(conv, CV_8UC3);
    }
    img = conv;
  }
  return img;
}

template <typename T>
inline void Store(T* dst, const float* src, uint32_t n);
template <>
inline void Store<float>(float* dst, const float* src, uint32_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}
template <>
inline void Store<uint16_t>(uint16_t* dst, const float* src, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) dst[i] = FloatToBf16(src[i]);
}

template <typename T>
void ResizePatchifyT(const cv::Mat& src_in, uint32_t H, uint32_t W, const PatchifyParams& p, T* out) {
  // Shrinks by an integer factor with an area filter first when the remaining
  // factor is above 2, so bilinear sampling does not alias.
  cv::Mat src = src_in;
  const int k = static_cast<int>(std::min(src.cols / (2.0 * W), src.rows / (2.0 * H)));
  if (k >= 2) {
    cv::Mat cropped = src(cv::Rect(0, 0, src.cols / k * k, src.rows / k * k));
    cv::Mat small;
    cv::resize(cropped, small, cv::Size(cropped.cols / k, cropped.rows / k), 0, 0, cv::INTER_AREA);
    src = small;
  }
  const int sw = src.cols, sh = src.rows;
  const float scale_x = static_cast<float>(sw) / W, scale_y = static_cast<float>(sh) / H;
  std::vector<int> x0(W), x1(W);
  std::vector<float> wx(W);
  for (uint32_t x = 0; x < W; ++x) {
    float fx = (x + 0.5f) * scale_x - 0.5f;
    if (fx < 0) fx = 0;
    int i = static_cast<int>(fx);
    if (i > sw - 1) i = sw - 1;
    x0[x] = i * 3;
    x1[x] = std::min(i + 1, sw - 1) * 3;
    wx[x] = fx - i;
  }
  float a[3], b[3];
  for (int c = 0; c < 3; ++c) {
    a[c] = 1.0f / (255.0f * p.std[c]);
    b[c] = -p.mean[c] / p.std[c];
  }
  const uint32_t P = p.patch, M = p.merge, Tt = p.temporal;
  const uint32_t gw = W / P;
  const size_t row_len = p.row_values();
  std::vector<float> row(3 * size_t{W});
  float* rc[3] = {row.data(), row.data() + W, row.data() + 2 * W};
  for (uint32_t y = 0; y < H; ++y) {
    float fy = (y + 0.5f) * scale_y - 0.5f;
    if (fy < 0) fy = 0;
    int iy = std::min(static_cast<int>(fy), sh - 1);
    const float wy = fy - iy;
    const uint8_t* s0 = src.ptr<uint8_t>(iy);
    const uint8_t* s1 = src.ptr<uint8_t>(std::min(iy + 1, sh - 1));
    for (uint32_t x = 0; x < W; ++x) {
      const uint8_t* p00 = s0 + x0[x];
      const uint8_t* p01 = s0 + x1[x];
      const uint8_t* p10 = s1 + x0[x];
      const uint8_t* p11 = s1 + x1[x];
      const float w = wx[x];
      for (int c = 0; c < 3; ++c) {
        const int ch = 2 - c;  // BGR -> RGB
        const float top = p00[ch] + (p01[ch] - p00[ch]) * w;
        const float bot = p10[ch] + (p11[ch] - p10[ch]) * w;
        rc[c][x] = (top + (bot - top) * wy) * a[c] + b[c];
      }
    }
    // Scatter the row into its patches.
    const uint32_t ph = y / P, py = y % P;
    const size_t group_row = size_t{ph / M} * (gw / M);
    for (uint32_t pw = 0; pw < gw; ++pw) {
      const size_t patch_row = (group_row + pw / M) * M * M + (ph % M) * M + (pw % M);
      T* base = out + patch_row * row_len;
      for (uint32_t c = 0; c < 3; ++c) {
        const float* from = rc[c] + size_t{pw} * P;
        for (uint32_t t = 0; t < Tt; ++t) Store<T>(base + ((c * Tt + t) * P + py) * P, from, P);
      }
    }
  }
}

}  // namespace

void ResizePatchifyInto(const cv::Mat& bgr, uint32_t height, uint32_t width,
                        const PatchifyParams& params, char* out) {
  if (params.bf16) {
    ResizePatchifyT<uint16_t>(bgr, height, width, params, reinterpret_cast<uint16_t*>(out));
  } else {
    ResizePatchifyT<float>(bgr, height, width, params, reinterpret_cast<float*>(out));
  }
}

absl::StatusOr<DecodeInfo> DecodeImageInto(absl::string_view bytes, absl::string_view name,
                                           ImageKind declared, uint32_t height, uint32_t width,
                                           const PatchifyParams& params, char* out,
                                           cv::Mat* decoded) {
  RETURN_IF_ERROR(CheckTarget(height, width, params));
  ASSIGN_OR_RETURN(ImageHeader header, CheckHeader(bytes, name, params));
  DecodeInfo info;
  info.kind = header.kind;
  info.source_width = header.width;
  info.source_height = header.height;
  info.mislabelled = declared != ImageKind::kUnknown && declared != header.kind;
  info.reduce = ChooseReduce(header, height, width, params);
  ASSIGN_OR_RETURN(cv::Mat img, Decode(bytes, name, info.reduce, header));
  ResizePatchifyInto(img, height, width, params, out);
  if (decoded) *decoded = img;
  return info;
}

absl::StatusOr<cv::Mat> DecodeImageSmall(absl::string_view bytes, absl::string_view name,
                                         const PatchifyParams& params, uint32_t max_side) {
  ASSIGN_OR_RETURN(ImageHeader header, CheckHeader(bytes, name, params));
  int reduce = 1;
  if (params.reduced_jpeg && header.kind == ImageKind::kJpeg) {
    for (int s : {8, 4, 2}) {
      if ((std::max(header.width, header.height) + s - 1) / s >= max_side) {
        reduce = s;
        break;
      }
    }
  }
  ASSIGN_OR_RETURN(cv::Mat img, Decode(bytes, name, reduce, header));
  const int longest = std::max(img.cols, img.rows);
  if (longest > static_cast<int>(max_side)) {
    const double f = static_cast<double>(max_side) / longest;
    cv::Mat small;
    cv::resize(img, small, cv::Size(std::max(1, static_cast<int>(img.cols * f)),
                                    std::max(1, static_cast<int>(img.rows * f))),
               0, 0, cv::INTER_AREA);
    img = small;
  }
  return img;
}

absl::Status NaiveDecodeInto(absl::string_view bytes, uint32_t height, uint32_t width,
                             const PatchifyParams& p, char* out) {
  RETURN_IF_ERROR(CheckTarget(height, width, p));
  cv::Mat bgr = Imdecode(bytes, cv::IMREAD_COLOR);
  if (bgr.empty()) return absl::DataLossError("image does not decode");
  cv::Mat rgb, resized, f32;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  cv::resize(rgb, resized, cv::Size(static_cast<int>(width), static_cast<int>(height)));
  resized.convertTo(f32, CV_32FC3, 1.0 / 255.0);
  f32 -= cv::Scalar(p.mean[0], p.mean[1], p.mean[2]);
  f32 /= cv::Scalar(p.std[0], p.std[1], p.std[2]);
  const uint32_t P = p.patch, M = p.merge, T = p.temporal;
  const uint32_t gh = height / P, gw = width / P;
  size_t i = 0;
  for (uint32_t bh = 0; bh < gh / M; ++bh) {
    for (uint32_t bw = 0; bw < gw / M; ++bw) {
      for (uint32_t mh = 0; mh < M; ++mh) {
        for (uint32_t mw = 0; mw < M; ++mw) {
          for (uint32_t c = 0; c < 3; ++c) {
            for (uint32_t t = 0; t < T; ++t) {
              for (uint32_t py = 0; py < P; ++py) {
                const float* src = f32.ptr<float>((bh * M + mh) * P + py);
                for (uint32_t px = 0; px < P; ++px, ++i) {
                  const float v = src[((bw * M + mw) * P + px) * 3 + c];
                  if (p.bf16) {
                    reinterpret_cast<uint16_t*>(out)[i] = FloatToBf16(v);
                  } else {
                    reinterpret_cast<float*>(out)[i] = v;
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tutti::stager
