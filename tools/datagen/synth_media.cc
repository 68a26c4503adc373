#include "tools/datagen/synth_media.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rng.h"

namespace tutti::datagen {
namespace {

constexpr const char* kWords[] = {
    "tutti",    "orchestra", "vision",  "token",  "patch",   "encoder", "packing", "balance",
    "stager",   "shard",     "cache",   "decode", "resize",  "merge",   "kernel",  "batch",
    "gradient", "lambda",    "sigma",   "matrix", "invoice", "total",   "receipt", "chart",
    "figure",   "table",     "axis",    "legend", "page",    "section", "alpha",   "omega",
    "42",       "3.14159",   "2026-01", "#7f3a",  "x=17",    "(a+b)^2", "ID:0932", "Q4",
};

cv::Scalar RandomColor(Rng& rng) {
  return cv::Scalar(static_cast<double>(rng.Below(256)), static_cast<double>(rng.Below(256)),
                    static_cast<double>(rng.Below(256)));
}

cv::Point RandomPoint(Rng& rng, int w, int h) {
  return cv::Point(static_cast<int>(rng.Below(static_cast<uint64_t>(w))),
                   static_cast<int>(rng.Below(static_cast<uint64_t>(h))));
}

// Linear gradient between two colours at a random angle.
void FillGradient(Rng& rng, cv::Mat& img) {
  const cv::Scalar c0 = RandomColor(rng), c1 = RandomColor(rng);
  const double angle = rng.Uniform(0, 6.283185307179586);
  const double ca = std::cos(angle), sa = std::sin(angle);
  const int w = img.cols, h = img.rows;
  // t(x, y) = (x*ca + y*sa - lo) / (hi - lo) over the image's corners.
  const double corners[4] = {0, (w - 1) * ca, (h - 1) * sa, (w - 1) * ca + (h - 1) * sa};
  const double lo = *std::min_element(corners, corners + 4);
  const double hi = *std::max_element(corners, corners + 4);
  const double span = hi - lo > 1e-9 ? hi - lo : 1.0;
  for (int y = 0; y < h; ++y) {
    uint8_t* row = img.ptr<uint8_t>(y);
    double t = (y * sa - lo) / span;
    const double dt = ca / span;
    for (int x = 0; x < w; ++x, t += dt) {
      for (int c = 0; c < 3; ++c) {
        row[3 * x + c] = static_cast<uint8_t>(c0[c] + (c1[c] - c0[c]) * t + 0.5);
      }
    }
  }
}

void DrawShapes(Rng& rng, cv::Mat& img) {
  const int w = img.cols, h = img.rows, side = std::min(w, h);
  const double area = static_cast<double>(w) * h;
  const int n = 6 + static_cast<int>(std::min(120.0, area / 60000.0));
  const int max_thick = std::max(2, side / 100);
  for (int i = 0; i < n; ++i) {
    const cv::Scalar color = RandomColor(rng);
    const int thick = rng.Bernoulli(0.4) ? cv::FILLED : static_cast<int>(rng.Between(1, max_thick));
    const int extent = std::max(2, static_cast<int>(side * rng.Uniform(0.03, 0.4)));
    const cv::Point p = RandomPoint(rng, w, h);
    switch (rng.Below(5)) {
      case 0:
        cv::rectangle(img, p, p + cv::Point(extent, static_cast<int>(extent * rng.Uniform(0.3, 2))),
                      color, thick, cv::LINE_8);
        break;
      case 1:
        cv::circle(img, p, extent / 2, color, thick, cv::LINE_AA);
        break;
      case 2:
        cv::ellipse(img, p, cv::Size(extent / 2, std::max(1, extent / 4)), rng.Uniform(0, 180), 0,
                    360, color, thick, cv::LINE_AA);
        break;
      case 3: {
        std::vector<cv::Point> poly;
        const int corners = static_cast<int>(rng.Between(3, 7));
        for (int k = 0; k < corners; ++k) {
          poly.push_back(p + cv::Point(static_cast<int>(rng.Between(-extent, extent)),
                                       static_cast<int>(rng.Between(-extent, extent))));
        }
        if (thick == cv::FILLED) {
          cv::fillPoly(img, std::vector<std::vector<cv::Point>>{poly}, color, cv::LINE_AA);
        } else {
          cv::polylines(img, poly, true, color, thick, cv::LINE_AA);
        }
        break;
      }
      default:
        cv::line(img, p, RandomPoint(rng, w, h), color, std::max(1, thick), cv::LINE_AA);
        break;
    }
  }
  // A ruled grid over part of the picture (tables, charts, documents).
  if (rng.Bernoulli(0.5)) {
    const cv::Scalar color = RandomColor(rng);
    const int step = std::max(4, static_cast<int>(side * rng.Uniform(0.02, 0.08)));
    const cv::Point a = RandomPoint(rng, w, h), b = RandomPoint(rng, w, h);
    const cv::Rect r(cv::Point(std::min(a.x, b.x), std::min(a.y, b.y)),
                     cv::Point(std::max(a.x, b.x), std::max(a.y, b.y)));
    for (int x = r.x; x <= r.x + r.width; x += step) {
      cv::line(img, {x, r.y}, {x, r.y + r.height}, color, 1, cv::LINE_8);
    }
    for (int y = r.y; y <= r.y + r.height; y += step) {
      cv::line(img, {r.x, y}, {r.x + r.width, y}, color, 1, cv::LINE_8);
    }
  }
}

void DrawText(Rng& rng, cv::Mat& img) {
  const int w = img.cols, h = img.rows, side = std::min(w, h);
  const double area = static_cast<double>(w) * h;
  const int lines = 2 + static_cast<int>(std::min(40.0, area / 150000.0));
  constexpr int kFonts[] = {cv::FONT_HERSHEY_SIMPLEX, cv::FONT_HERSHEY_PLAIN,
                            cv::FONT_HERSHEY_DUPLEX, cv::FONT_HERSHEY_COMPLEX,
                            cv::FONT_HERSHEY_TRIPLEX};
  constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);
  for (int i = 0; i < lines; ++i) {
    std::string text;
    const int words = static_cast<int>(rng.Between(1, 6));
    for (int k = 0; k < words; ++k)
      absl::StrAppend(&text, k ? " " : "", kWords[rng.Below(kNumWords)]);
    const int font = kFonts[rng.Below(5)];
    // Glyph height between 1% and 6% of the short side (Hershey fonts are ~22 px at scale 1).
    const double scale = std::max(0.3, side * rng.Uniform(0.01, 0.06) / 22.0);
    const int thick = std::max(1, static_cast<int>(scale * rng.Uniform(0.8, 2.0)));
    cv::putText(img, text, RandomPoint(rng, w, h), font, scale, RandomColor(rng), thick,
                cv::LINE_AA);
  }
}

void AddNoise(Rng& rng, cv::Mat& img) {
  const double sigma = rng.Uniform(1.5, 8.0);
  cv::RNG cvrng(rng.Next());
  cv::Mat noise(img.size(), img.type());
  cvrng.fill(noise, cv::RNG::NORMAL, cv::Scalar::all(128), cv::Scalar::all(sigma));
  cv::addWeighted(img, 1.0, noise, 1.0, -128.0, img);
}

}  // namespace

void RenderImage(const ImageSpec& spec, cv::Mat* out) {
  Rng rng(spec.seed);
  cv::Mat img(static_cast<int>(spec.height), static_cast<int>(spec.width), CV_8UC3);
  FillGradient(rng, img);
  DrawShapes(rng, img);
  DrawText(rng, img);
  AddNoise(rng, img);
  if (spec.channels == 1) {
    cv::cvtColor(img, *out, cv::COLOR_BGR2GRAY);
  } else if (spec.channels == 4) {
    cv::Mat bgra;
    cv::cvtColor(img, bgra, cv::COLOR_BGR2BGRA);
    // Alpha: a radial falloff from a random centre, never fully transparent.
    const cv::Point c = RandomPoint(rng, img.cols, img.rows);
    const double radius = std::hypot(img.cols, img.rows) * rng.Uniform(0.4, 1.0);
    for (int y = 0; y < bgra.rows; ++y) {
      uint8_t* row = bgra.ptr<uint8_t>(y);
      for (int x = 0; x < bgra.cols; ++x) {
        const double d = std::hypot(x - c.x, y - c.y) / radius;
        row[4 * x + 3] = static_cast<uint8_t>(255.0 - 200.0 * std::min(1.0, d));
      }
    }
    *out = std::move(bgra);
  } else {
    *out = std::move(img);
  }
}

absl::StatusOr<std::string> RenderEncodedImage(const ImageSpec& spec, const EncodeOptions& enc) {
  const char* ext = ".jpg";
  std::vector<int> params;
  switch (spec.format) {
    case ImageKind::kJpeg:
      params = {cv::IMWRITE_JPEG_QUALITY, enc.jpeg_quality};
      break;
    case ImageKind::kPng:
      ext = ".png";
      params = {cv::IMWRITE_PNG_COMPRESSION, enc.png_compression};
      break;
    case ImageKind::kWebp:
      ext = ".webp";
      params = {cv::IMWRITE_WEBP_QUALITY, enc.webp_quality};
      break;
    default:
      return absl::InvalidArgumentError("cannot encode an image of unknown format");
  }
  try {
    cv::Mat img;
    RenderImage(spec, &img);
    std::vector<uint8_t> buf;
    if (!cv::imencode(ext, img, buf, params)) {
      return absl::InternalError(absl::StrCat("OpenCV could not encode a ", spec.width, "x",
                                              spec.height, " image as ", ext));
    }
    return std::string(buf.begin(), buf.end());
  } catch (const cv::Exception& e) {
    return absl::InternalError(absl::StrCat("OpenCV failed on a ", spec.width, "x", spec.height,
                                            " ", ext, " image: ", e.what()));
  }
}

std::string RenderWav(uint32_t duration_ms, uint32_t sample_rate, uint64_t seed) {
  Rng rng(seed);
  const uint64_t frames = static_cast<uint64_t>(duration_ms) * sample_rate / 1000;
  std::vector<float> signal(frames, 0.0f);
  const double rate = sample_rate;
  // Notes: consecutive segments with a fundamental, two harmonics and an
  // attack/decay envelope.
  for (uint64_t start = 0; start < frames;) {
    const uint64_t len = static_cast<uint64_t>(rate * rng.Uniform(0.08, 0.6));
    const double f0 = rng.LogUniform(80.0, 900.0);
    const double amp = rng.Uniform(0.1, 0.35);
    const double h2 = rng.Uniform(0, 0.5), h3 = rng.Uniform(0, 0.3);
    const bool rest = rng.Bernoulli(0.15);
    for (uint64_t i = 0; i < len && start + i < frames && !rest; ++i) {
      const double t = i / rate;
      const double env = std::min(1.0, t / 0.01) * std::exp(-3.0 * t);
      const double ph = 6.283185307179586 * f0 * t;
      signal[start + i] += static_cast<float>(
          amp * env * (std::sin(ph) + h2 * std::sin(2 * ph) + h3 * std::sin(3 * ph)));
    }
    start += len;
  }
  // A slow sweep underneath and a little noise.
  const double f_lo = rng.Uniform(100, 300), f_hi = rng.Uniform(1000, 4000);
  const double seconds = std::max(1e-3, frames / rate);
  double phase = 0;
  for (uint64_t i = 0; i < frames; ++i) {
    const double f = f_lo + (f_hi - f_lo) * (i / rate) / seconds;
    phase += 6.283185307179586 * f / rate;
    signal[i] += static_cast<float>(0.05 * std::sin(phase) + 0.01 * rng.Normal());
  }

  std::string out(44 + 2 * frames, '\0');
  auto put32 = [&](size_t at, uint32_t v) { std::memcpy(&out[at], &v, 4); };
  auto put16 = [&](size_t at, uint16_t v) { std::memcpy(&out[at], &v, 2); };
  std::memcpy(&out[0], "RIFF", 4);
  put32(4, static_cast<uint32_t>(36 + 2 * frames));
  std::memcpy(&out[8], "WAVEfmt ", 8);
  put32(16, 16);  // fmt chunk size
  put16(20, 1);   // PCM
  put16(22, 1);   // mono
  put32(24, sample_rate);
  put32(28, sample_rate * 2);  // byte rate
  put16(32, 2);                // block align
  put16(34, 16);               // bits per sample
  std::memcpy(&out[36], "data", 4);
  put32(40, static_cast<uint32_t>(2 * frames));
  for (uint64_t i = 0; i < frames; ++i) {
    const float s = std::clamp(signal[i], -1.0f, 1.0f);
    const int16_t v = static_cast<int16_t>(std::lrint(s * 32767.0f));
    std::memcpy(&out[44 + 2 * i], &v, 2);
  }
  return out;
}

}  // namespace tutti::datagen
