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

// Costs at one stage (max_pixels). Thread-safe (const).
class StageCoster {
 public:
  StageCoster(const v1::JobConfig& config, const Index& index, uint64_t max_pixels);

  // Fails only when an image cannot be resized (INVALID_ARGUMENT from
  // SmartResize, e.g. an aspect ratio above vision.max_aspect_ratio).
  absl::StatusOr<SampleCost> Cost(uint32_t sample) const;
  absl::StatusOr<ImageGeometry> Image(uint32_t media) const;
  uint32_t AudioTokens(uint32_t audio_ms) const;
  const CostModel& model() const { return model_; }
  const VisionGeometryOptions& geometry() const { return geometry_; }

 private:
  const Index& index_;
  VisionGeometryOptions geometry_;
  CostModel model_;
  uint32_t frames_per_token_;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_COSTS_H_
