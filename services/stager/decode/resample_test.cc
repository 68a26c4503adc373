#include "services/stager/decode/resample.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::stager {
namespace {

cv::Mat Noise(int h, int w, uint32_t seed) {
  cv::Mat img(h, w, CV_8UC3);
  std::mt19937 rng(seed);
  for (int y = 0; y < h; ++y) {
    uint8_t* p = img.ptr<uint8_t>(y);
    for (int i = 0; i < 3 * w; ++i) p[i] = static_cast<uint8_t>(rng());
  }
  return img;
}

cv::Mat Checkerboard(int h, int w) {
  cv::Mat img(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const uint8_t v = (x + y) % 2 ? 255 : 0;
      img.at<cv::Vec3b>(y, x) = cv::Vec3b(v, v, v);
    }
  }
  return img;
}

TEST(ResampleTest, FilterWeightsSumToOneAndWidenWhenShrinking) {
  for (auto [in, out] : {std::pair{100, 100}, {100, 37}, {37, 100}, {5120, 1316}, {2880, 2884}}) {
    const AxisFilter f = MakeBicubicFilter(in, out);
    ASSERT_EQ(f.out_size, out);
    for (int x = 0; x < out; ++x) {
      // Each weight rounded on its own, as PIL does: the sum is within half
      // a unit per tap of one.
      int sum = 0;
      for (int t = 0; t < f.taps; ++t) sum += f.weights[x * f.taps + t];
      EXPECT_LE(std::abs(sum - (1 << kResamplePrecision)), f.taps / 2 + 1)
          << in << "->" << out << " at " << x;
      EXPECT_GE(f.first[x], 0);
      EXPECT_LE(f.first[x] + f.count[x], in);
    }
    // Shrinking, the kernel covers 4 input samples times the shrink factor;
    // otherwise at most 4 (1 where input and output samples coincide).
    const double stretch = double(in) / out;
    if (stretch > 1) {
      EXPECT_LE(f.count[out / 2], static_cast<int>(std::ceil(4 * stretch)) + 1);
      EXPECT_GE(f.count[out / 2], static_cast<int>(std::floor(4 * stretch)) - 1);
    } else {
      EXPECT_LE(f.count[out / 2], 4);
    }
  }
}

TEST(ResampleTest, SimdAndPortableLoopsGiveTheSameBytes) {
  uint32_t seed = 1;
  for (auto [h, w, oh, ow] : {std::array{57, 91, 28, 56},
                              {300, 200, 84, 56},
                              {64, 64, 140, 168},
                              {97, 131, 96, 132},
                              {480, 270, 112, 224},
                              {29, 500, 56, 28},
                              {1000, 17, 28, 28},
                              // Shrinks of thousands of taps, where the kernels' split
                              // sums wrap around before their exact result.
                              {4, 30000, 3, 7},
                              {30000, 4, 7, 3}}) {
    const cv::Mat src = Noise(h, w, seed++);
    cv::Mat fast, slow;
    ResampleBicubic(src, oh, ow, &fast, {.simd = true});
    ResampleBicubic(src, oh, ow, &slow, {.simd = false});
    ASSERT_EQ(fast.rows, oh);
    ASSERT_EQ(fast.cols, ow);
    EXPECT_EQ(cv::norm(fast, slow, cv::NORM_INF), 0) << w << "x" << h << " -> " << ow << "x" << oh;
  }
}

// The horizontal kernel for filters with few taps (no shrink or a small
// one: blocks of 32 pixels reading one run of input) against the portable
// loop: near-identity sizes both ways, enlargements, odd widths, widths just
// over and under a block, and random sizes, one-axis resizes included.
TEST(ResampleTest, FewTapHorizontalKernelGivesThePortableBytes) {
  std::vector<std::array<int, 4>> sizes = {
      {8, 4096, 8, 4088}, {6, 5120, 6, 5124}, {5, 1080, 5, 1092}, {4, 3840, 4, 3836},
      {3, 2560, 3, 2548}, {9, 33, 9, 32},     {9, 31, 9, 33},     {7, 64, 7, 65},
      {7, 65, 7, 64},     {5, 97, 5, 96},     {5, 96, 5, 97},     {4, 100, 4, 130},
      {6, 130, 6, 100},   {3, 1001, 3, 999},  {3, 999, 3, 1001},  {40, 333, 37, 301}};
  std::mt19937 rng(7);
  for (int i = 0; i < 40; ++i) {
    const int w = 1 + static_cast<int>(rng() % 700);
    // Mostly within 1.3x of the input width, where the kernel applies.
    const int ow = std::max(1, static_cast<int>(w * (0.8 + 0.5 * (rng() % 1000) / 1000.0)));
    sizes.push_back({1 + static_cast<int>(rng() % 9), w, 1 + static_cast<int>(rng() % 9), ow});
  }
  uint32_t seed = 100;
  for (const auto& [h, w, oh, ow] : sizes) {
    const cv::Mat src = Noise(h, w, seed++);
    cv::Mat fast, slow;
    ResampleBicubic(src, oh, ow, &fast, {.simd = true});
    ResampleBicubic(src, oh, ow, &slow, {.simd = false});
    ASSERT_EQ(fast.size(), cv::Size(ow, oh));
    EXPECT_EQ(cv::norm(fast, slow, cv::NORM_INF), 0) << w << "x" << h << " -> " << ow << "x" << oh;
  }
}

// One pass over a whole image, written plainly: its rows rounded to 8 bits.
cv::Mat PlainPass(const cv::Mat& src, const AxisFilter& f, bool horizontal) {
  cv::Mat out =
      horizontal ? cv::Mat(src.rows, f.out_size, CV_8UC3) : cv::Mat(f.out_size, src.cols, CV_8UC3);
  for (int y = 0; y < out.rows; ++y) {
    for (int x = 0; x < out.cols; ++x) {
      const int o = horizontal ? x : y;
      for (int c = 0; c < 3; ++c) {
        int64_t acc = int64_t{1} << (kResamplePrecision - 1);
        for (int t = 0; t < f.count[o]; ++t) {
          const int i = f.first[o] + t;
          const int v = horizontal ? src.at<cv::Vec3b>(y, i)[c] : src.at<cv::Vec3b>(i, x)[c];
          acc += int64_t{v} * f.weights[static_cast<size_t>(o) * f.taps + t];
        }
        out.at<cv::Vec3b>(y, x)[c] =
            static_cast<uint8_t>(std::clamp<int64_t>(acc >> kResamplePrecision, 0, 255));
      }
    }
  }
  return out;
}

TEST(ResampleTest, StripsEqualTheTwoPassesOverWholeImages) {
  const cv::Mat src = Noise(97, 131, 11);
  for (const auto& size : {std::pair{40, 50}, {97, 60}, {30, 131}, {150, 170}, {23, 300}, {1, 1}}) {
    const int oh = size.first, ow = size.second;  // named: the strip callback captures them
    const AxisFilter fh = MakeBicubicFilter(src.cols, ow), fv = MakeBicubicFilter(src.rows, oh);
    {
      // PIL's order: horizontal, then vertical over the 8-bit rows.
      cv::Mat expect;
      if (ow == src.cols) {
        expect = PlainPass(src, fv, false);
      } else if (oh == src.rows) {
        expect = PlainPass(src, fh, true);
      } else {
        expect = PlainPass(PlainPass(src, fh, true), fv, false);
      }
      for (bool simd : {true, false}) {
        for (int strip_rows : {1, 7, 28, 1000}) {
          cv::Mat got(oh, ow, CV_8UC3, cv::Scalar::all(0));
          int next = 0;
          ResampleBicubicStrips(src, oh, ow, strip_rows,
                                [&](const cv::Mat& strip, int y0) {
                                  EXPECT_EQ(y0, next);
                                  EXPECT_EQ(strip.rows, std::min(strip_rows, oh - y0));
                                  strip.copyTo(got.rowRange(y0, y0 + strip.rows));
                                  next = y0 + strip.rows;
                                },
                                {.simd = simd});
          EXPECT_EQ(next, oh);
          EXPECT_EQ(cv::norm(got, expect, cv::NORM_INF), 0)
              << ow << "x" << oh << " strips of " << strip_rows << (simd ? " simd" : " portable");
        }
      }
    }
  }
}

TEST(ResampleTest, FlatStaysFlatAndSameSizeIsUntouched) {
  cv::Mat flat(123, 77, CV_8UC3, cv::Scalar(13, 200, 255));
  for (auto [oh, ow] : {std::pair{28, 28}, {300, 140}, {123, 56}}) {
    cv::Mat out;
    ResampleBicubic(flat, oh, ow, &out);
    cv::Mat expect(oh, ow, CV_8UC3, cv::Scalar(13, 200, 255));
    EXPECT_EQ(cv::norm(out, expect, cv::NORM_INF), 0) << ow << "x" << oh;
  }
  const cv::Mat noise = Noise(56, 84, 7);
  cv::Mat same;
  ResampleBicubic(noise, 56, 84, &same);
  EXPECT_EQ(cv::norm(noise, same, cv::NORM_INF), 0);
}

TEST(ResampleTest, OnePixelCheckerboardShrunkComesOutGrey) {
  // The filter widens with the shrink factor, so the finest texture there
  // is averages out instead of aliasing into a moire.
  const cv::Mat board = Checkerboard(840, 1120);
  for (double shrink : {2.0, 2.5, 3.0, 3.5, 4.0}) {
    const int oh = static_cast<int>(840 / shrink) / 28 * 28,
              ow = static_cast<int>(1120 / shrink) / 28 * 28;
    cv::Mat out;
    ResampleBicubic(board, oh, ow, &out);
    double lo, hi;
    cv::minMaxLoc(out.reshape(1), &lo, &hi);
    EXPECT_GE(lo, 127.5 - 8) << shrink;
    EXPECT_LE(hi, 127.5 + 8) << shrink;
  }
}

}  // namespace
}  // namespace tutti::stager
