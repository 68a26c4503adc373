#include "common/media_header.h"

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "gtest/gtest.h"

namespace tutti {
namespace {

std::string Encode(const std::string& ext, int w, int h) {
  cv::Mat img(h, w, CV_8UC3, cv::Scalar(10, 20, 30));
  std::vector<uchar> buf;
  EXPECT_TRUE(cv::imencode(ext, img, buf));
  return std::string(buf.begin(), buf.end());
}

TEST(MediaHeaderTest, ReadsSizesOfAllFormats) {
  struct Case { const char* ext; ImageKind kind; };
  for (Case c : {Case{".jpg", ImageKind::kJpeg}, Case{".png", ImageKind::kPng},
                 Case{".webp", ImageKind::kWebp}}) {
    auto h = ReadImageHeader(Encode(c.ext, 321, 123));
    ASSERT_TRUE(h.ok()) << c.ext << " " << h.status();
    EXPECT_EQ(h->kind, c.kind);
    EXPECT_EQ(h->width, 321u) << c.ext;
    EXPECT_EQ(h->height, 123u) << c.ext;
  }
}

TEST(MediaHeaderTest, LosslessWebpHeader) {
  cv::Mat img(77, 55, CV_8UC3, cv::Scalar(1, 2, 3));
  std::vector<uchar> buf;
  ASSERT_TRUE(cv::imencode(".webp", img, buf, {cv::IMWRITE_WEBP_QUALITY, 101}));
  auto h = ReadImageHeader(std::string(buf.begin(), buf.end()));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->width, 55u);
  EXPECT_EQ(h->height, 77u);
}

TEST(MediaHeaderTest, BadInputIsAnError) {
  EXPECT_EQ(ReadImageHeader("").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadImageHeader("hello world").status().code(), absl::StatusCode::kInvalidArgument);
  std::string jpg = Encode(".jpg", 64, 64);
  EXPECT_EQ(ReadImageHeader(jpg.substr(0, 10)).status().code(), absl::StatusCode::kDataLoss);
  std::string png = Encode(".png", 64, 64);
  EXPECT_EQ(ReadImageHeader(png.substr(0, 16)).status().code(), absl::StatusCode::kDataLoss);
}

TEST(MediaHeaderTest, WavDuration) {
  std::string wav = "RIFF____WAVEfmt ";
  auto put32 = [&](uint32_t v) { for (int i = 0; i < 4; ++i) wav.push_back(char((v >> (8 * i)) & 0xFF)); };
  auto put16 = [&](uint16_t v) { wav.push_back(char(v & 0xFF)); wav.push_back(char(v >> 8)); };
  put32(16); put16(1); put16(1); put32(16000); put32(32000); put16(2); put16(16);
  wav += "data";
  put32(32000 * 3);  // 3 seconds
  wav.append(32000 * 3, '\0');
  auto h = ReadWavHeader(wav);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->sample_rate, 16000u);
  EXPECT_EQ(h->duration_ms, 3000u);
  EXPECT_FALSE(ReadWavHeader("RIFF____WAVEjunk").ok());
}

TEST(MediaHeaderTest, WebpWhoseBitstreamLibwebpRefusesIsCorrupt) {
  // A RIFF/WEBP container with a corrupt VP8 frame and "DICM" at byte 128:
  // OpenCV's WebP decoder refuses it, so cv::imdecode tried its other
  // decoders and handed it to the DICOM reader, which allocated gigabytes
  // (found by fuzz/image_decode_fuzzer). The header reader refuses it first.
  cv::Mat img(40, 60, CV_8UC3, cv::Scalar(10, 120, 200));
  std::vector<uint8_t> buf;
  ASSERT_TRUE(cv::imencode(".webp", img, buf, {cv::IMWRITE_WEBP_QUALITY, 75}));
  std::string webp(buf.begin(), buf.end());
  ASSERT_TRUE(ReadImageHeader(webp).ok());
  webp.resize(std::max<size_t>(webp.size(), 140), '\0');
  webp.replace(128, 4, "DICM");
  // The VP8 frame tag: a shown key frame whose first partition (0x7ffff
  // bytes) runs past the chunk.
  webp.replace(20, 3, "\xf0\xff\xff");
  auto h = ReadImageHeader(webp);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss) << h.status();
}

}  // namespace
}  // namespace tutti
