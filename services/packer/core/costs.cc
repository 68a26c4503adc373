#include "services/packer/core/costs.h"

#include "common/job_config.h"

namespace tutti::packer {

StageCoster::StageCoster(const v1::JobConfig& config, const Index& index, uint64_t max_pixels)
    : index_(index),
      geometry_(GeometryOptions(config, max_pixels)),
      model_(CostOptions(config)),
      frames_per_token_(std::max<uint32_t>(1, config.audio().frames_per_token())) {}

absl::StatusOr<ImageGeometry> StageCoster::Image(uint32_t media) const {
  return SmartResize(index_.media_height(media), index_.media_width(media), geometry_);
}

uint32_t StageCoster::AudioTokens(uint32_t audio_ms) const {
  const uint64_t frames = (uint64_t{audio_ms} + 9) / 10;  // 10 ms frames
  return static_cast<uint32_t>((frames + frames_per_token_ - 1) / frames_per_token_);
}

absl::StatusOr<SampleCost> StageCoster::Cost(uint32_t s) const {
  SampleCost c;
  c.text_tokens = index_.text_tokens(s);
  uint64_t tokens = c.text_tokens;
  for (uint32_t j = index_.media_begin(s), e = index_.media_end(s); j < e; ++j) {
    if (index_.media_is_image(j)) {
      auto g = Image(j);
      if (!g.ok()) return g.status();
      c.image_tokens += g->llm_tokens;
      c.patches += g->patches;
      c.vit += model_.Vit(g->patches);
      tokens += g->llm_tokens + 2;
      ++c.images;
    } else {
      const uint32_t t = AudioTokens(index_.media_audio_ms(j));
      c.audio_tokens += t;
      c.audio_cost += model_.Audio(t);
      tokens += t + 2;
      ++c.audio;
    }
  }
  c.llm_tokens = tokens > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(tokens);
  c.llm = model_.Llm(c.llm_tokens);
  return c;
}

}  // namespace tutti::packer
