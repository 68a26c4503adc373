// Per-sample sizes and costs at a curriculum stage.
//
//   image:  SmartResize(h, w, stage max_pixels) (what the stager will do);
//           LLM tokens = patches / merge^2, ViT cost = a*p + b*p^2
//   audio:  tokens = ceil(duration_ms / 10 / frames_per_token)
//   sample: LLM tokens = text + sum(image tokens + 2) + sum(audio tokens + 2)
//           (the +2 are the start/end markers); LLM cost = alpha*n + beta*n^2
#ifndef TUTTI_SERVICES_PACKER_CORE_COSTS_H_
#define TUTTI_SERVICES_PACKER_CORE_COSTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cost_model.h"
#include "common/smart_resize.h"
#include "services/packer/index/index.h"
#include "tutti/v1/job.pb.h"

namespace tutti::packer {

struct SampleCost {
  uint32_t text_tokens = 0;
  uint32_t llm_tokens = 0;
  uint32_t image_tokens = 0;  // LLM tokens of its images (no markers)
  uint32_t patches = 0;
  uint32_t audio_tokens = 0;
  uint16_t images = 0;
  uint16_t audio = 0;
  double vit = 0;  // sum over its images
  double llm = 0;
  double audio_cost = 0;
};

// A lower max_pixels for the images of media [first, end) (a mixture
// source's ceiling, MixtureSource.max_pixels).
struct MediaCeiling {
  uint32_t first = 0, end = 0;
  uint64_t max_pixels = 0;
};

// Costs at one stage (max_pixels). Thread-safe (const). Every image's
// resized grid is computed once, at construction (4 bytes per medium), so
// that planning a step reads it instead of resizing again.
class StageCoster {
 public:
  // `ceilings`: ascending, disjoint ranges whose images resize under
  // min(max_pixels, their ceiling).
  StageCoster(const v1::JobConfig& config, const Index& index, uint64_t max_pixels,
              std::vector<MediaCeiling> ceilings = {});

  // Fails only when an image cannot be resized (INVALID_ARGUMENT from
  // SmartResize, e.g. an aspect ratio above vision.max_aspect_ratio).
  absl::StatusOr<SampleCost> Cost(uint32_t sample) const;
  absl::StatusOr<ImageGeometry> Image(uint32_t media) const;
  // The hot path of Image: true and *g set when the image resizes at this
  // stage; false when Image(media) fails (call it for the error).
  bool ImageGeometryOf(uint32_t media, ImageGeometry* g) const {
    return GeometryOfGrid(grid_[media], g);
  }
  // The packed resized grid of an image (0: take Image's slow path), and
  // ImageGeometryOf from it: for reading the grids apart from using them.
  uint32_t Grid(uint32_t media) const { return grid_[media]; }
  bool GeometryOfGrid(uint32_t grid, ImageGeometry* g) const {
    if (grid == 0) return false;
    g->grid_t = 1;
    g->grid_h = grid >> 16;
    g->grid_w = grid & 0xFFFF;
    g->height = g->grid_h * geometry_.patch_size;
    g->width = g->grid_w * geometry_.patch_size;
    g->patches = g->grid_h * g->grid_w;
    g->llm_tokens = g->patches / (geometry_.merge_size * geometry_.merge_size);
    return true;
  }
  void PrefetchGrid(uint32_t first_media) const { __builtin_prefetch(grid_.data() + first_media); }
  uint32_t AudioTokens(uint32_t audio_ms) const;
  const CostModel& model() const { return model_; }
  const VisionGeometryOptions& geometry() const { return geometry_; }

 private:
  // The geometry options of a medium: the stage's, or its ceiling's.
  const VisionGeometryOptions& GeometryFor(uint32_t media) const;

  const Index& index_;
  VisionGeometryOptions geometry_;
  std::vector<MediaCeiling> ceilings_;
  std::vector<VisionGeometryOptions> ceiling_geometry_;  // per ceiling
  CostModel model_;
  uint32_t frames_per_token_;
  // Per medium: grid_h << 16 | grid_w of its resized image; 0 for audio and
  // for images that do not resize (or whose grid does not fit 16 bits).
  std::vector<uint32_t> grid_;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_COSTS_H_
