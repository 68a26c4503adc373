#include "common/smart_resize.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tutti {
namespace {

double RoundByFactor(double x, double f) { return std::nearbyint(x / f) * f; }
double FloorByFactor(double x, double f) { return std::floor(x / f) * f; }
double CeilByFactor(double x, double f) { return std::ceil(x / f) * f; }

}  // namespace

absl::StatusOr<ImageGeometry> SmartResize(uint32_t height, uint32_t width,
                                          const VisionGeometryOptions& opts) {
  if (height == 0 || width == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("image has an empty side (", width, "x", height, ")"));
  }
  if (opts.patch_size == 0 || opts.merge_size == 0) {
    return absl::InvalidArgumentError("vision.patch_size and vision.merge_size must be positive");
  }
  const double factor = static_cast<double>(opts.patch_size) * opts.merge_size;
  const double h = height, w = width;
  const double aspect = std::max(h, w) / std::min(h, w);
  if (aspect > opts.max_aspect_ratio) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image ", width, "x", height, " has aspect ratio ", aspect, ", above the limit of ",
        opts.max_aspect_ratio, " (vision.max_aspect_ratio)"));
  }
  if (opts.max_pixels < factor * factor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_pixels ", opts.max_pixels, " is below one merged patch (", factor * factor,
        " pixels); raise max_pixels"));
  }
  double h_bar = std::max(factor, RoundByFactor(h, factor));
  double w_bar = std::max(factor, RoundByFactor(w, factor));
  if (h_bar * w_bar > static_cast<double>(opts.max_pixels)) {
    const double beta = std::sqrt(h * w / static_cast<double>(opts.max_pixels));
    h_bar = std::max(factor, FloorByFactor(h / beta, factor));
    w_bar = std::max(factor, FloorByFactor(w / beta, factor));
  } else if (h_bar * w_bar < static_cast<double>(opts.min_pixels)) {
    const double beta = std::sqrt(static_cast<double>(opts.min_pixels) / (h * w));
    h_bar = CeilByFactor(h * beta, factor);
    w_bar = CeilByFactor(w * beta, factor);
  }
  ImageGeometry g;
  g.height = static_cast<uint32_t>(h_bar);
  g.width = static_cast<uint32_t>(w_bar);
  g.grid_t = 1;
  g.grid_h = g.height / opts.patch_size;
  g.grid_w = g.width / opts.patch_size;
  g.patches = g.grid_t * g.grid_h * g.grid_w;
  g.llm_tokens = g.patches / (opts.merge_size * opts.merge_size);
  return g;
}

}  // namespace tutti
