// Drawn steps for post-balancing tests: hand-made ones (samples added one by
// one) and seed-workload ones drawn by the planner (test-only).
#ifndef TUTTI_SERVICES_PACKER_TESTING_POST_SAMPLES_H_
#define TUTTI_SERVICES_PACKER_TESTING_POST_SAMPLES_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "common/cost_model.h"
#include "gtest/gtest.h"
#include "services/packer/bench/bench_workload.h"
#include "services/packer/bench/staging.h"
#include "services/packer/core/job.h"
#include "services/packer/core/plan_check.h"
#include "services/packer/core/planner.h"
#include "services/packer/core/post_balancing/post_balancing.h"

namespace tutti::dispatch::testing {

using packer::PlannedAudio;
using packer::PlannedImage;
using packer::PlannedSample;

inline constexpr uint32_t kHiddenSize = 64;  // embedding bytes per token: 64 x bf16

// An empty drawn step of `world` ranks (per_node per node), one text and one
// VL micro-batch of one sequence each by default.
inline StepPlanData EmptyStep(uint32_t world, uint32_t per_node, uint32_t seq_len,
                              uint32_t text_seqs = 1, uint32_t vl_seqs = 1) {
  StepPlanData p;
  p.world_size = world;
  p.ranks_per_node = per_node;
  p.seq_len = seq_len;
  p.text_seqs = text_seqs;
  p.vl_seqs = vl_seqs;
  return p;
}

inline DispatchOptions SmallOptions(uint32_t world, uint32_t per_node, uint32_t seq_len,
                                    uint32_t text_seqs = 1, uint32_t vl_seqs = 1) {
  DispatchOptions o;
  o.cluster = {world, per_node};
  o.slots.seq_len = seq_len;
  o.slots.text_micro_batches = text_seqs;
  o.slots.text_micro_batch = 1;
  o.slots.vl_micro_batches = vl_seqs;
  o.slots.vl_micro_batch = 1;
  o.hidden_size = kHiddenSize;
  return o;
}

inline PlannedSample& AddSample(StepPlanData* p, bool vl, uint32_t text, uint32_t drawn,
                                uint32_t shard) {
  PlannedSample& s = p->samples.emplace_back();
  s.sample = static_cast<uint32_t>(p->samples.size() - 1);
  s.shard = shard;
  s.drawn_rank = drawn;
  s.vl = vl;
  s.first_image = static_cast<uint32_t>(p->images.size());
  s.first_audio = static_cast<uint32_t>(p->audio.size());
  s.cost.text_tokens = s.cost.llm_tokens = text;
  s.cost.llm = CostModel(CostModelOptions()).Llm(text);
  return s;
}

inline void AddText(StepPlanData* p, uint32_t tokens, uint32_t drawn = 0, uint32_t shard = 0) {
  AddSample(p, false, tokens, drawn, shard);
}

// A VL sample with images of the given patch counts (LLM tokens = patches/4,
// two markers per image) and `text` text tokens.
inline void AddVl(StepPlanData* p, std::initializer_list<uint32_t> patches, uint32_t text,
                  uint32_t drawn = 0, uint32_t shard = 0) {
  const CostModel model{CostModelOptions()};
  PlannedSample& s = AddSample(p, true, text, drawn, shard);
  const uint32_t owner = static_cast<uint32_t>(p->samples.size() - 1);
  for (uint32_t n : patches) {
    PlannedImage& im = p->images.emplace_back();
    im.owner = owner;
    im.image_index = s.cost.images++;
    im.patches = n;
    im.llm_tokens = n / 4;
    im.grid_h = 2, im.grid_w = n / 2, im.height = 28, im.width = 7 * n;
    im.cost = model.Vit(n);
    im.output_bytes = uint64_t{im.llm_tokens} * kHiddenSize * 2;
    im.input_bytes = PixelBytes(n, 2, 14, 4);
    s.cost.image_tokens += im.llm_tokens;
    s.cost.patches += n;
    s.cost.vit += im.cost;
    s.cost.llm_tokens += im.llm_tokens + 2;
  }
  s.cost.llm = model.Llm(s.cost.llm_tokens);
}

// Adds an audio clip of `tokens` encoder tokens to the last (VL) sample.
inline void AddAudio(StepPlanData* p, uint32_t tokens) {
  const CostModel model{CostModelOptions()};
  PlannedSample& s = p->samples.back();
  PlannedAudio& au = p->audio.emplace_back();
  au.owner = static_cast<uint32_t>(p->samples.size() - 1);
  au.audio_index = s.cost.audio++;
  au.tokens = tokens;
  au.frames = tokens * 4;
  au.cost = model.Audio(tokens);
  au.output_bytes = uint64_t{tokens} * kHiddenSize * 2;
  au.input_bytes = uint64_t{tokens} * 4 * 160 * 4;
  s.cost.audio_tokens += tokens;
  s.cost.audio_cost += au.cost;
  s.cost.llm_tokens += tokens + 2;
  s.cost.llm = model.Llm(s.cost.llm_tokens);
  s.vl = true;
}

// Lays out a dispatched step (lists, exchanges, totals) and checks it.
inline absl::Status FinishAndCheck(StepPlanData* p, const ShardAvailability& staging,
                                   uint32_t img_cap = 0) {
  packer::LayOutStep(65536, p);
  packer::SummarizeStep(true, p);
  packer::PlanCheckOptions o;
  o.staging = &staging;
  o.img_cap = img_cap;
  return packer::CheckPlannedStep(*p, o);
}

// Step 0 of the seed workload (8,192-token sequences, 1 MP) for `world`
// ranks, drawn by the planner, with the post-balancing options of its job.
struct SeedStep {
  StepPlanData drawn;
  DispatchOptions options;
  uint32_t images = 0;
};

inline SeedStep DrawSeedStep(uint32_t world, uint32_t per_node, double audio = 0,
                             uint64_t seed = 1) {
  using Key = std::tuple<double, uint64_t>;
  static auto* indexes = new std::map<Key, std::shared_ptr<const packer::Index>>();
  packer::SeedWorkloadOptions wo;
  wo.seq_len = 8192;
  wo.ranks_per_node = per_node;
  wo.fill = 0.8;
  wo.audio_fraction = audio;
  wo.seed = seed;
  wo.samples_per_shard = 10;
  auto& index = (*indexes)[Key{audio, seed}];
  if (index == nullptr) {
    auto made = packer::MakeSeedIndex(wo, 40000);
    EXPECT_TRUE(made.ok()) << made.status();
    index = *made;
  }
  SeedStep out;
  auto shape = packer::SeedShape(wo, *index, world, packer::kSeedStage1MaxPixels);
  EXPECT_TRUE(shape.ok()) << shape.status();
  auto job = packer::Job::Create(
      packer::SeedConfig(wo, *shape, world, packer::kSeedStage1MaxPixels, "tutti", 1, true), index);
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return out;
  EXPECT_TRUE(packer::Planner(*job).Draw(0, &out.drawn).ok());
  out.options = packer::PostBalancingOptions((*job)->dispatcher_options());
  out.options.cost = (*job)->coster(0).model().options();
  out.images = static_cast<uint32_t>(out.drawn.images.size());
  return out;
}

}  // namespace tutti::dispatch::testing

#endif  // TUTTI_SERVICES_PACKER_TESTING_POST_SAMPLES_H_
