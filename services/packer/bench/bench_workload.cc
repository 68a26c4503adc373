#include "services/packer/bench/bench_workload.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/status.h"
#include "services/packer/bench/synthetic.h"
#include "services/packer/core/costs.h"

namespace tutti::packer {

SyntheticOptions SeedSyntheticOptions(const SeedWorkloadOptions& o, uint64_t samples) {
  SyntheticOptions s = SyntheticFromWorkload(kSeedWorkload, samples);
  s.seed = o.seed;
  s.vl_fraction = o.vl_share;
  s.audio_fraction = o.audio_fraction;
  s.max_text_tokens = o.seq_len;
  s.fit_seq_len = o.seq_len;
  s.fit_max_pixels = kSeedStage2MaxPixels;
  s.samples_per_shard = o.samples_per_shard;
  return s;
}

absl::StatusOr<std::string> MakeSeedIndexBytes(const SeedWorkloadOptions& o, uint64_t samples) {
  return MakeSyntheticIndex(SeedSyntheticOptions(o, samples));
}

absl::StatusOr<std::shared_ptr<const Index>> MakeSeedIndex(const SeedWorkloadOptions& o,
                                                           uint64_t samples) {
  ASSIGN_OR_RETURN(std::string bytes, MakeSeedIndexBytes(o, samples));
  return Index::FromString(bytes, "seed-workload");
}

absl::StatusOr<SeedStepShape> SeedShape(const SeedWorkloadOptions& o, const Index& index,
                                        uint32_t ranks, uint64_t max_pixels) {
  v1::JobConfig base;
  base.mutable_vision()->set_patch_size(o.patch_size);
  base.mutable_vision()->set_merge_size(o.merge_size);
  ApplyJobDefaults(&base);
  const StageCoster coster(base, index, max_pixels);
  double text = 0, vl = 0;
  for (uint32_t s = 0; s < index.num_samples(); ++s) {
    ASSIGN_OR_RETURN(SampleCost c, coster.Cost(s));
    (index.is_vl(s) ? vl : text) += c.llm_tokens;
  }
  SeedStepShape best;
  best.mean_text_tokens = text / std::max<size_t>(1, index.text_samples().size());
  best.mean_vl_tokens = vl / std::max<size_t>(1, index.vl_samples().size());
  double best_err = 1e9;
  for (uint32_t t = 1; t < o.seqs_per_rank; ++t) {
    SeedStepShape s = best;
    s.text_seqs = t;
    s.vl_seqs = o.seqs_per_rank - t;
    const double cap = double(ranks) * o.seq_len * o.fill;
    s.text_samples = static_cast<uint32_t>(cap * t / s.mean_text_tokens);
    s.vl_samples = static_cast<uint32_t>(cap * s.vl_seqs / s.mean_vl_tokens);
    const double share = double(s.vl_samples) / (s.vl_samples + s.text_samples);
    const double err = std::abs(share - o.vl_share);
    if (err < best_err) best_err = err, best = s;
  }
  if (best.text_samples > index.text_samples().size() ||
      best.vl_samples > index.vl_samples().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the benchmark dataset is too small for ", ranks, " ranks (a step draws ",
        best.text_samples, " text and ", best.vl_samples, " VL samples); raise --samples"));
  }
  return best;
}

v1::JobConfig SeedConfig(const SeedWorkloadOptions& o, const SeedStepShape& shape, uint32_t ranks,
                         uint64_t max_pixels, const std::string& strategy, uint32_t open_bins,
                         bool post_balancing) {
  v1::JobConfig c;
  c.set_job_id("bench-seed");
  c.set_seed(o.seed);
  c.set_world_size(ranks);
  c.set_ranks_per_node(std::min(ranks, o.ranks_per_node));
  auto* b = c.mutable_batch();
  b->set_text_samples_per_step(shape.text_samples);
  b->set_vl_samples_per_step(shape.vl_samples);
  b->set_grad_accum(2);
  b->set_text_micro_batch(shape.text_seqs);
  b->set_vl_micro_batch(shape.vl_seqs);
  b->set_text_vl_ratio(absl::StrCat(shape.text_seqs, ":", shape.vl_seqs));
  auto* stage = c.add_curriculum();
  stage->set_start_step(0);
  stage->set_max_pixels(max_pixels);
  stage->set_seq_len(o.seq_len);
  c.mutable_packing()->set_strategy(strategy);
  c.mutable_packing()->set_open_bins(open_bins);
  c.mutable_post_balancing()->set_enabled(post_balancing);
  if (o.patch_size != 14 || o.merge_size != 2) {
    c.mutable_vision()->set_patch_size(o.patch_size);
    c.mutable_vision()->set_merge_size(o.merge_size);
  }
  ApplyJobDefaults(&c);
  return c;
}

}  // namespace tutti::packer
