#include "services/stager/decode/decode.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "gtest/gtest.h"
#include "services/stager/decode/resample.h"
#include "services/stager/decode/skip.h"

namespace tutti::stager {
namespace {

std::string Encode(const cv::Mat& img, const char* ext) {
  std::vector<uchar> buf;
  EXPECT_TRUE(cv::imencode(ext, img, buf));
  return std::string(buf.begin(), buf.end());
}

cv::Mat Pattern(int h, int w) {
  cv::Mat img(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      img.at<cv::Vec3b>(y, x) = cv::Vec3b(static_cast<uchar>((x * 7 + y) & 255),
                                          static_cast<uchar>((y * 5) & 255),
                                          static_cast<uchar>((x * y) & 255));
    }
  }
  return img;
}

// Straightforward reference of the Qwen2-VL layout: the image as
// (T, C, H, W), reshaped to (T, C, gh/m, m, p, gw/m, m, p) and transposed to
// (gh/m, gw/m, m, m, C, T, p, p), flattened.
std::vector<float> Reference(const cv::Mat& bgr, const PatchifyParams& prm) {
  const int H = bgr.rows, W = bgr.cols, P = prm.patch, M = prm.merge, T = prm.temporal;
  const int gh = H / P, gw = W / P;
  std::vector<float> out(size_t(gh) * gw * 3 * T * P * P);
  size_t i = 0;
  for (int a = 0; a < gh / M; ++a)
    for (int b = 0; b < gw / M; ++b)
      for (int mh = 0; mh < M; ++mh)
        for (int mw = 0; mw < M; ++mw)
          for (int c = 0; c < 3; ++c)
            for (int t = 0; t < T; ++t)
              for (int py = 0; py < P; ++py)
                for (int px = 0; px < P; ++px) {
                  const int y = (a * M + mh) * P + py, x = (b * M + mw) * P + px;
                  const float v = bgr.at<cv::Vec3b>(y, x)[2 - c] / 255.0f;
                  out[i++] = (v - prm.mean[c]) / prm.std[c];
                }
  return out;
}

TEST(DecodeTest, LayoutMatchesReferenceFloat32AndBf16) {
  const cv::Mat img = Pattern(56, 84);  // already patch-aligned: no resampling
  const std::string png = Encode(img, ".png");
  for (bool bf16 : {false, true}) {
    PatchifyParams p;
    p.bf16 = bf16;
    std::vector<char> out(p.ImageBytes(56, 84));
    auto info = DecodeImageInto(png, "a.png", ImageKind::kPng, 56, 84, p, out.data());
    ASSERT_TRUE(info.ok()) << info.status();
    const std::vector<float> ref = Reference(img, p);
    ASSERT_EQ(ref.size() * p.value_bytes(), out.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const float got = bf16 ? Bf16ToFloat(reinterpret_cast<uint16_t*>(out.data())[i])
                             : reinterpret_cast<float*>(out.data())[i];
      ASSERT_NEAR(got, ref[i], bf16 ? 0.02 : 1e-5) << "value " << i;
    }
  }
}

TEST(DecodeTest, OtherPatchGeometry) {
  PatchifyParams p;
  p.patch = 16;
  p.merge = 2;
  p.temporal = 1;
  const cv::Mat img = Pattern(64, 96);
  std::vector<char> out(p.ImageBytes(64, 96));
  ASSERT_TRUE(DecodeImageInto(Encode(img, ".png"), "b.png", ImageKind::kPng, 64, 96, p, out.data()).ok());
  const std::vector<float> ref = Reference(img, p);
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_NEAR(reinterpret_cast<float*>(out.data())[i], ref[i], 1e-5) << i;
  }
}

TEST(DecodeTest, ResizedImagesArePatchifiedStripByStripLikeTheWholeResizedImage) {
  // The default path resizes and patchifies one strip of patch*merge rows at
  // a time; it must equal resizing the whole image first, then patchifying.
  const cv::Mat img = Pattern(301, 437);
  const std::string png = Encode(img, ".png");
  for (auto [h, w] : {std::pair{112, 168}, {280, 420}, {336, 476}, {56, 28}}) {
    for (bool bf16 : {false, true}) {
      PatchifyParams p;
      p.bf16 = bf16;
      std::vector<char> fused(p.ImageBytes(h, w)), whole(p.ImageBytes(h, w));
      ASSERT_TRUE(DecodeImageInto(png, "c.png", ImageKind::kPng, h, w, p, fused.data()).ok());
      cv::Mat resized;
      ResampleBicubic(img, h, w, &resized);
      Patchify(resized, p, whole.data());
      EXPECT_EQ(std::memcmp(fused.data(), whole.data(), whole.size()), 0)
          << w << "x" << h << (bf16 ? " bf16" : " f32");
    }
  }
}

TEST(DecodeTest, FastResizeCloseToBilinear) {
  PatchifyParams p;
  p.resize = ResizeMode::kFast;
  const cv::Mat img = Pattern(150, 230);
  const std::string png = Encode(img, ".png");
  std::vector<char> fused(p.ImageBytes(112, 168));
  ASSERT_TRUE(DecodeImageInto(png, "c.png", ImageKind::kPng, 112, 168, p, fused.data()).ok());
  cv::Mat bilinear;
  cv::resize(img, bilinear, cv::Size(168, 112), 0, 0, cv::INTER_LINEAR);
  const std::vector<float> ref = Reference(bilinear, p);
  const float* f = reinterpret_cast<float*>(fused.data());
  double sum = 0;
  for (size_t i = 0; i < ref.size(); ++i) sum += std::abs(f[i] - ref[i]);
  EXPECT_LT(sum / ref.size(), 0.05);
}

TEST(DecodeTest, JpegUsesReducedDecodeWhenTargetIsSmall) {
  PatchifyParams p;
  const std::string jpg = Encode(Pattern(448, 448), ".jpg");
  std::vector<char> out(p.ImageBytes(112, 112));
  // HF mode leaves the bicubic filter at least 1.75x of shrink: 448 -> 224 -> 112.
  auto info = DecodeImageInto(jpg, "d.jpg", ImageKind::kJpeg, 112, 112, p, out.data());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->reduce, 2);
  // Fast mode scales as far as the target: 448 -> 112.
  p.resize = ResizeMode::kFast;
  info = DecodeImageInto(jpg, "d.jpg", ImageKind::kJpeg, 112, 112, p, out.data());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->reduce, 4);
  auto full = DecodeImageInto(jpg, "d.jpg", ImageKind::kJpeg, 448, 448, p,
                              std::vector<char>(p.ImageBytes(448, 448)).data());
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->reduce, 1);
}

TEST(DecodeTest, WebpDecodes) {
  PatchifyParams p;
  std::vector<char> out(p.ImageBytes(56, 56));
  auto info = DecodeImageInto(Encode(Pattern(60, 70), ".webp"), "e.webp", ImageKind::kWebp, 56, 56,
                              p, out.data());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kind, ImageKind::kWebp);
}

TEST(DecodeTest, BadInputIsAClearError) {
  PatchifyParams p;
  std::vector<char> out(p.ImageBytes(56, 56));
  const std::string jpg = Encode(Pattern(64, 64), ".jpg");
  // Zero bytes.
  auto empty = DecodeImageInto("", "s/0001.jpg", ImageKind::kJpeg, 56, 56, p, out.data());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(empty.status().message().find("s/0001.jpg"), std::string::npos);
  // Not an image at all.
  auto text = DecodeImageInto("hello, this is not a picture", "s/0002.jpg", ImageKind::kJpeg, 56,
                              56, p, out.data());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_STREQ(SkipReason(text.status()), "corrupt");
  // Truncated: header intact, scan data cut.
  auto cut = DecodeImageInto(jpg.substr(0, jpg.size() / 3), "s/0003.jpg", ImageKind::kJpeg, 56, 56,
                             p, out.data());
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(cut.status().message().find("truncated"), std::string::npos);
  EXPECT_STREQ(SkipReason(cut.status()), "truncated");
  // Truncated PNG (no IEND chunk) and WebP (shorter than its RIFF size): refused
  // before the decoder, which would return the rows it got.
  const std::string png_full = Encode(Pattern(64, 64), ".png");
  auto png_cut = DecodeImageInto(png_full.substr(0, png_full.size() - 20), "s/0009.png",
                                 ImageKind::kPng, 56, 56, p, out.data());
  EXPECT_EQ(png_cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(png_cut.status().message().find("s/0009.png: truncated PNG"), std::string::npos)
      << png_cut.status();
  EXPECT_STREQ(SkipReason(png_cut.status()), "truncated");
  const std::string webp_full = Encode(Pattern(64, 64), ".webp");
  auto webp_cut = DecodeImageInto(webp_full.substr(0, webp_full.size() * 2 / 3), "s/0010.webp",
                                  ImageKind::kWebp, 56, 56, p, out.data());
  EXPECT_EQ(webp_cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(webp_cut.status().message().find("s/0010.webp: truncated WebP"), std::string::npos)
      << webp_cut.status();
  EXPECT_STREQ(SkipReason(webp_cut.status()), "truncated");
  EXPECT_TRUE(DecodeImageInto(png_full, "s/0011.png", ImageKind::kPng, 56, 56, p, out.data()).ok());
  EXPECT_TRUE(DecodeImageInto(webp_full, "s/0012.webp", ImageKind::kWebp, 56, 56, p, out.data()).ok());
  // Corrupt: garbage after the header.
  std::string bad = jpg;
  for (size_t i = 200; i < bad.size(); ++i) bad[i] = static_cast<char>(0xFF);
  auto corrupt = DecodeImageInto(bad, "s/0004.jpg", ImageKind::kJpeg, 56, 56, p, out.data());
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kDataLoss);
  // Corrupt scan data that keeps its end marker: decodes to something or fails, never crashes.
  std::string mangled = jpg;
  for (size_t i = mangled.size() / 2; i < mangled.size() - 2; i += 3) mangled[i] = 0x00;
  auto m = DecodeImageInto(mangled, "s/0008.jpg", ImageKind::kJpeg, 56, 56, p, out.data());
  EXPECT_TRUE(m.ok() || m.status().code() == absl::StatusCode::kDataLoss);
  // libjpeg's "Corrupt JPEG data" warnings are counted (and logged with the name), not printed.
  if (m.ok()) EXPECT_GT(m->warnings, 0);
  // Mislabelled: a PNG named .jpg decodes by content and is reported.
  auto mis = DecodeImageInto(Encode(Pattern(56, 56), ".png"), "s/0005.jpg", ImageKind::kJpeg, 56,
                             56, p, out.data());
  ASSERT_TRUE(mis.ok());
  EXPECT_TRUE(mis->mislabelled);
  // Absurd dimensions in the header: refused before decoding.
  std::string png = Encode(Pattern(8, 8), ".png");
  png[16] = 0x00, png[17] = 0x01, png[18] = 0x00, png[19] = 0x00;  // width 65536
  png[20] = 0x00, png[21] = 0x01, png[22] = 0x00, png[23] = 0x00;  // height 65536
  auto bomb = DecodeImageInto(png, "s/0006.png", ImageKind::kPng, 56, 56, p, out.data());
  EXPECT_EQ(bomb.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(bomb.status().message().find("65536x65536"), std::string::npos);
  // A target that is not patch-aligned.
  EXPECT_EQ(DecodeImageInto(jpg, "s/0007.jpg", ImageKind::kJpeg, 50, 56, p, out.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tutti::stager
