#include "services/packer/core/costs.h"

#include <algorithm>

#include "common/job_config.h"

namespace tutti::packer {

StageCoster::StageCoster(const v1::JobConfig& config, const Index& index, uint64_t max_pixels,
                         std::vector<MediaCeiling> ceilings)
    : index_(index),
      geometry_(GeometryOptions(config, max_pixels)),
      model_(CostOptions(config)),
      frames_per_token_(std::max<uint32_t>(1, config.audio().frames_per_token())) {
  for (const MediaCeiling& c : ceilings) {
    if (c.max_pixels == 0 || c.max_pixels >= max_pixels || c.first >= c.end) continue;
    ceilings_.push_back(c);
    ceiling_geometry_.push_back(GeometryOptions(config, c.max_pixels));
  }
  grid_.assign(index.num_media(), 0);
  for (uint32_t j = 0; j < index.num_media(); ++j) {
    if (!index.media_is_image(j)) continue;
    auto g = SmartResize(index.media_height(j), index.media_width(j), GeometryFor(j));
    if (!g.ok() || g->grid_h == 0 || g->grid_w == 0 || g->grid_h > 0xFFFF || g->grid_w > 0xFFFF) {
      continue;
    }
    grid_[j] = g->grid_h << 16 | g->grid_w;
    // Kept only where the packed grid gives back exactly what SmartResize
    // said; anything else takes the slow path.
    ImageGeometry back;
    if (!ImageGeometryOf(j, &back) || back.height != g->height || back.width != g->width ||
        back.grid_t != g->grid_t || back.patches != g->patches ||
        back.llm_tokens != g->llm_tokens) {
      grid_[j] = 0;
    }
  }
}

const VisionGeometryOptions& StageCoster::GeometryFor(uint32_t media) const {
  if (ceilings_.empty()) return geometry_;
  auto it = std::upper_bound(ceilings_.begin(), ceilings_.end(), media,
                             [](uint32_t m, const MediaCeiling& c) { return m < c.first; });
  if (it == ceilings_.begin()) return geometry_;
  --it;
  return media < it->end ? ceiling_geometry_[it - ceilings_.begin()] : geometry_;
}

absl::StatusOr<ImageGeometry> StageCoster::Image(uint32_t media) const {
  ImageGeometry g;
  if (ImageGeometryOf(media, &g)) return g;
  return SmartResize(index_.media_height(media), index_.media_width(media), GeometryFor(media));
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
