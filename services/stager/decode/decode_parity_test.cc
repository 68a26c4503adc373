// The stager's pixels against HF's Qwen2-VL preprocessing, written out with
// Debian's PIL and numpy in tools/hf_preprocess.py, on real photographs
// (Debian's wallpaper packages, tools/fetch_photos.sh) and a fine texture:
// PSNR per shrink band for the default (HF-parity) resize and the fast one,
// and the bicubic resize alone byte for byte against PIL's on block patterns.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/media_header.h"
#include "gtest/gtest.h"
#include "services/stager/decode/decode.h"
#include "services/stager/decode/resample.h"

namespace tutti::stager {
namespace {

namespace fs = std::filesystem;

const char kPython[] = "/usr/bin/python3";
const std::string kScript = std::string(TUTTI_SOURCE_DIR) + "/tools/hf_preprocess.py";

struct Photo {
  std::string path;
  std::string bytes;
  ImageHeader header;
};

std::string RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  ::pclose(p);
  return out;
}

// The photographs: $TUTTI_PHOTOS, else what tools/fetch_photos.sh fetches
// (cached under ~/.cache/tutti/photos). Empty when neither is there.
std::string PhotoDir() {
  if (const char* env = std::getenv("TUTTI_PHOTOS"); env != nullptr && *env) return env;
  std::string dir =
      RunCommand(std::string(TUTTI_SOURCE_DIR) + "/tools/fetch_photos.sh 2>/dev/null");
  while (!dir.empty() && (dir.back() == '\n' || dir.back() == '\r')) dir.pop_back();
  return fs::exists(dir + "/jpeg") ? dir : "";
}

std::vector<Photo> Photos(const std::string& dir, size_t n) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  std::vector<Photo> out;
  for (const auto& f : files) {
    if (out.size() >= n) break;
    auto bytes = ReadFileToString(f);
    if (!bytes.ok()) continue;
    auto h = ReadImageHeader(*bytes);
    if (!h.ok()) continue;
    out.push_back(Photo{f, std::move(*bytes), *h});
  }
  return out;
}

// One comparison: an image at a target size.
struct Case {
  std::string path;          // the encoded image
  const std::string* bytes;  // its bytes
  uint32_t height, width;
  double shrink;    // linear factor, source over target
  std::string ref;  // HF-style pixel_values written here
};

// Runs the HF-style path for every case in one Python process.
void WriteReferences(const std::vector<Case>& cases, const std::string& dir) {
  const std::string requests = dir + "/requests.txt";
  std::ofstream req(requests);
  for (const Case& c : cases) {
    req << "write " << c.path << " " << c.height << " " << c.width << " " << c.ref << "\n";
  }
  req.close();
  const std::string out = RunCommand(absl::StrCat(kPython, " ", kScript, " < ", requests));
  ASSERT_EQ(std::count(out.begin(), out.end(), '\n'), static_cast<long>(cases.size())) << out;
  ASSERT_EQ(out.find("error"), std::string::npos) << out;
}

std::vector<float> ReadFloats(const std::string& path) {
  auto bytes = ReadFileToString(path);
  EXPECT_TRUE(bytes.ok()) << path;
  std::vector<float> v(bytes.ok() ? bytes->size() / 4 : 0);
  if (!v.empty()) std::memcpy(v.data(), bytes->data(), v.size() * 4);
  return v;
}

// PSNR of two pixel_values arrays in 8-bit units (the normalisation undone
// per channel); 99 when identical.
double Psnr(const std::vector<float>& a, const float* b, const PatchifyParams& p) {
  const size_t plane = size_t{p.temporal} * p.patch * p.patch;
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const size_t c = (i / plane) % 3;
    const double d = (double(a[i]) - b[i]) * p.std[c] * 255.0;
    sum += d * d;
  }
  if (sum == 0) return 99;
  return 10 * std::log10(255.0 * 255.0 / (sum / a.size()));
}

// Our pixel_values for one image; `reduce` gets the JPEG DCT scaling used.
std::vector<float> Decoded(const Case& c, const PatchifyParams& p, absl::Status* status,
                           int* reduce = nullptr) {
  std::vector<float> out(p.ImageBytes(c.height, c.width) / 4);
  auto info = DecodeImageInto(*c.bytes, c.path, ImageKind::kUnknown, c.height, c.width, p,
                              reinterpret_cast<char*>(out.data()));
  *status = info.status();
  if (reduce != nullptr && info.ok()) *reduce = info->reduce;
  return out;
}

const char* Band(double shrink) { return shrink < 2 ? "<2x" : shrink < 4 ? "2-4x" : ">=4x"; }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

class DecodeParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kPython) || !fs::exists(kScript)) GTEST_SKIP() << "no " << kPython;
    if (RunCommand(absl::StrCat(kPython, " -c 'import PIL, numpy; print(1)' 2>&1")) != "1\n") {
      GTEST_SKIP() << "python3-pil or python3-numpy missing";
    }
    tmp_ = fs::temp_directory_path() / absl::StrCat("tutti_parity_", ::getpid());
    fs::create_directories(tmp_);
  }
  void TearDown() override {
    std::error_code ec;
    if (!tmp_.empty()) fs::remove_all(tmp_, ec);
  }
  std::string Tmp(const std::string& name) const { return (tmp_ / name).string(); }

  fs::path tmp_;
};

TEST_F(DecodeParityTest, PhotographsMatchHfInEveryShrinkBand) {
  const std::string dir = PhotoDir();
  if (dir.empty()) GTEST_SKIP() << "no photographs (tools/fetch_photos.sh could not fetch them)";
  std::vector<Photo> photos;
  for (auto [sub, n] : {std::pair{"jpeg", 5}, {"png", 3}, {"webp", 2}}) {  // the first, by name
    for (Photo& p : Photos(dir + "/" + sub, n)) photos.push_back(std::move(p));
  }
  ASSERT_GE(photos.size(), 5u);
  std::vector<Case> cases;
  for (const Photo& ph : photos) {
    const uint32_t w = ph.header.width, h = ph.header.height;
    for (double s : {1.0, 1.6, 2.5, 3.5, 5.0, 8.0}) {
      // Unshrunk only for the smaller photographs: at 15 MP the Python path
      // alone takes seconds per case.
      if (s == 1.0 && uint64_t{w} * h > 4'000'000) continue;
      const uint32_t tw = std::max<uint32_t>(28, std::lround(w / s / 28) * 28);
      const uint32_t th = std::max<uint32_t>(28, std::lround(h / s / 28) * 28);
      const double shrink = std::sqrt(double(w) * h / (double(tw) * th));
      cases.push_back(
          Case{ph.path, &ph.bytes, th, tw, shrink, Tmp(absl::StrCat(cases.size(), ".f32"))});
    }
  }
  WriteReferences(cases, tmp_.string());
  std::map<std::string, std::vector<double>> parity, fast;
  std::map<std::string, int> exact;  // cases without DCT scaling (all bit for bit)
  PatchifyParams hf_mode, fast_mode;
  fast_mode.resize = ResizeMode::kFast;
  for (const Case& c : cases) {
    const std::vector<float> ref = ReadFloats(c.ref);
    for (auto [params, table] : {std::pair{&hf_mode, &parity}, {&fast_mode, &fast}}) {
      absl::Status s;
      int reduce = 1;
      const std::vector<float> ours = Decoded(c, *params, &s, &reduce);
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_EQ(ours.size(), ref.size()) << c.path;
      const double psnr = Psnr(ref, ours.data(), *params);
      (*table)[Band(c.shrink)].push_back(psnr);
      if (params != &hf_mode) continue;
      // PIL's decode and PIL's resize: without DCT scaling (which PIL does
      // not do) every value is HF's.
      if (reduce == 1) {
        EXPECT_EQ(psnr, 99) << c.path << " at " << c.width << "x" << c.height << " (" << c.shrink
                            << "x)";
        ++exact[Band(c.shrink)];
      }
      if (psnr < 45) {
        std::printf("  note: %s at %ux%u (%.2fx, DCT 1/%d): %.1f dB\n", c.path.c_str(), c.width,
                    c.height, c.shrink, reduce, psnr);
      }
    }
  }
  std::printf("PSNR against the HF-style reference (%zu photographs, %zu cases)\n", photos.size(),
              cases.size());
  std::printf("  %-6s %6s %8s %10s %8s %10s %8s\n", "band", "cases", "no DCT", "hf median",
              "hf min", "fast median", "fast min");
  for (const char* band : {"<2x", "2-4x", ">=4x"}) {
    const auto& p = parity[band];
    const auto& f = fast[band];
    ASSERT_FALSE(p.empty()) << band;
    std::printf("  %-6s %6zu %8d %10.1f %8.1f %10.1f %8.1f\n", band, p.size(), exact[band],
                Median(p), *std::min_element(p.begin(), p.end()), Median(f),
                *std::min_element(f.begin(), f.end()));
    EXPECT_GE(Median(p), 45.0) << band;
  }
}

TEST_F(DecodeParityTest, UnshrunkPatchAlignedImageIsBitExact) {
  // A photograph-like image already at a patch-aligned size: no resampling
  // on either side, so every value must be HF's exactly.
  cv::Mat img(336, 448, CV_8UC3);
  cv::randu(img, cv::Scalar::all(0), cv::Scalar::all(256));
  cv::GaussianBlur(img, img, cv::Size(5, 5), 1.5);
  const std::string png = Tmp("aligned.png");
  ASSERT_TRUE(cv::imwrite(png, img));
  auto bytes = ReadFileToString(png);
  ASSERT_TRUE(bytes.ok());
  for (bool bf16 : {false, true}) {
    Case c{png, &*bytes, 336, 448, 1.0, Tmp("aligned.f32")};
    WriteReferences({c}, tmp_.string());
    PatchifyParams p;
    p.bf16 = bf16;
    std::vector<uint16_t> out16(p.ImageBytes(336, 448) / 2);
    std::vector<float> ours(p.ImageBytes(336, 448) / 4);
    char* dst = bf16 ? reinterpret_cast<char*>(out16.data()) : reinterpret_cast<char*>(ours.data());
    ASSERT_TRUE(DecodeImageInto(*bytes, png, ImageKind::kPng, 336, 448, p, dst).ok());
    const std::vector<float> ref = ReadFloats(c.ref);
    if (bf16) {
      ASSERT_EQ(ref.size(), out16.size());
      for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(out16[i], FloatToBf16(ref[i])) << i;
    } else {
      ASSERT_EQ(ref.size(), ours.size());
      ASSERT_EQ(std::memcmp(ref.data(), ours.data(), ref.size() * 4), 0);
    }
  }
}

TEST_F(DecodeParityTest, FineTextureShrunkIsFlatGreyLikeHf) {
  // A 1-pixel checkerboard: HF renders it flat grey when shrinking, a
  // resize that does not widen its filter renders a moire.
  cv::Mat board(840, 1120, CV_8UC3);
  for (int y = 0; y < board.rows; ++y) {
    for (int x = 0; x < board.cols; ++x)
      board.at<cv::Vec3b>(y, x) = cv::Vec3b::all((x + y) % 2 ? 255 : 0);
  }
  const std::string png = Tmp("board.png");
  ASSERT_TRUE(cv::imwrite(png, board));
  auto bytes = ReadFileToString(png);
  ASSERT_TRUE(bytes.ok());
  std::vector<Case> cases;
  for (auto [h, w] : {std::pair{392, 532}, {308, 420}, {252, 336}, {224, 280}}) {  // 2.1x to 4x
    cases.push_back(
        Case{png, &*bytes, uint32_t(h), uint32_t(w), 840.0 / h, Tmp(absl::StrCat("b", h, ".f32"))});
  }
  WriteReferences(cases, tmp_.string());
  PatchifyParams p;
  for (const Case& c : cases) {
    absl::Status s;
    const std::vector<float> ours = Decoded(c, p, &s);
    ASSERT_TRUE(s.ok()) << s;
    const size_t plane = size_t{p.temporal} * p.patch * p.patch;
    double lo = 255, hi = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      const size_t ch = (i / plane) % 3;
      const double v = (ours[i] * p.std[ch] + p.mean[ch]) * 255.0;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    EXPECT_GE(lo, 127.5 - 8) << c.width << "x" << c.height;
    EXPECT_LE(hi, 127.5 + 8) << c.width << "x" << c.height;
    EXPECT_GE(Psnr(ReadFloats(c.ref), ours.data(), p), 45.0) << c.width << "x" << c.height;
  }
}

// Rows of blocks 1 to 24 pixels on a side in random colours, black and white
// among them: the bicubic kernel's negative lobes overshoot at every edge, so
// the rounding and clipping to 8 bits between the two passes, and so the
// order of the passes, show in the output.
cv::Mat Blocks(int h, int w, uint32_t seed) {
  std::mt19937 rng(seed);
  cv::Mat img(h, w, CV_8UC3);
  for (int y0 = 0; y0 < h;) {
    const int bh = std::min<int>(1 + rng() % 24, h - y0);
    for (int x0 = 0; x0 < w;) {
      const int bw = std::min<int>(1 + rng() % 24, w - x0);
      cv::Vec3b c;
      for (int k = 0; k < 3; ++k) {
        const uint32_t r = rng() % 4;
        c[k] = r == 0 ? 0 : r == 1 ? 255 : static_cast<uint8_t>(rng());
      }
      img(cv::Rect(x0, y0, bw, bh)).setTo(cv::Scalar(c[0], c[1], c[2]));
      x0 += bw;
    }
    y0 += bh;
  }
  return img;
}

TEST_F(DecodeParityTest, BlockPatternsResampleExactlyAsPil) {
  // PIL's Image.resize(..., BICUBIC) resamples horizontally first, then
  // vertically, each pass rounded and clipped to 8 bits: the default resize
  // must give its bytes exactly, shrinking by up to 8x (where the other order
  // would be cheaper), enlarging, one axis shrunk and the other enlarged,
  // one axis alone, and near-identity sizes.
  const std::vector<std::array<int, 4>> sizes = {
      // source h, w -> target h, w
      {600, 800, 84, 112},  {1000, 700, 280, 196}, {720, 1280, 252, 448},  {1001, 333, 125, 41},
      {300, 400, 150, 392}, {97, 131, 300, 50},    {200, 300, 200, 150},   {200, 300, 90, 300},
      {50, 60, 140, 168},   {64, 48, 65, 47},      {400, 1500, 392, 1484}, {1600, 2560, 784, 1260},
      {333, 777, 28, 56},   {29, 500, 56, 28},     {2000, 60, 250, 59},    {123, 456, 124, 228}};
  std::vector<cv::Mat> sources;
  std::vector<Case> cases;
  std::string bytes;  // unused: the resize is compared alone, without decode
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto& [h, w, oh, ow] = sizes[i];
    sources.push_back(Blocks(h, w, static_cast<uint32_t>(i + 1)));
    const std::string png = Tmp(absl::StrCat("blocks", i, ".png"));
    ASSERT_TRUE(cv::imwrite(png, sources.back()));
    cases.push_back(
        Case{png, &bytes, uint32_t(oh), uint32_t(ow), 0, Tmp(absl::StrCat("pil", i, ".rgb"))});
  }
  const std::string requests = Tmp("resize.txt");
  std::ofstream req(requests);
  for (const Case& c : cases)
    req << "resize " << c.path << " " << c.height << " " << c.width << " " << c.ref << "\n";
  req.close();
  const std::string out = RunCommand(absl::StrCat(kPython, " ", kScript, " < ", requests));
  ASSERT_EQ(out.find("error"), std::string::npos) << out;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    auto pil = ReadFileToString(c.ref);
    ASSERT_TRUE(pil.ok()) << out;
    ASSERT_EQ(pil->size(), size_t{3} * c.height * c.width);
    for (bool simd : {true, false}) {
      cv::Mat ours, rgb;
      ResampleBicubic(sources[i], int(c.height), int(c.width), &ours,
                      ResampleOptions{.simd = simd});
      cv::cvtColor(ours, rgb, cv::COLOR_BGR2RGB);
      ASSERT_TRUE(rgb.isContinuous());
      size_t differ = 0;
      int worst = 0;
      for (size_t k = 0; k < pil->size(); ++k) {
        const int d = std::abs(int(rgb.data[k]) - int(static_cast<uint8_t>((*pil)[k])));
        differ += d != 0;
        worst = std::max(worst, d);
      }
      EXPECT_EQ(differ, 0u) << sources[i].cols << "x" << sources[i].rows << " -> " << c.width << "x"
                            << c.height << (simd ? " simd" : " portable") << ": " << differ
                            << " of " << pil->size() << " bytes differ from PIL's, by up to "
                            << worst << " levels";
    }
  }
}

}  // namespace
}  // namespace tutti::stager
