#include "services/packer/core/plan_audit.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/packer/core/sampler.h"

namespace tutti::packer {
namespace {

absl::Status Differs(const StepPlanData& p, const std::string& what) {
  return absl::InternalError(absl::StrCat("step ", p.step, ": ", what));
}

bool Close(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max({1.0, a, b}); }

// max, mean and max(mean, largest item) of per-rank loads.
struct Phase {
  double max = 0, mean = 0, bound = 0;
};
Phase Measure(const std::vector<double>& load, double largest) {
  Phase f;
  for (double x : load) f.max = std::max(f.max, x), f.mean += x;
  f.mean /= std::max<size_t>(1, load.size());
  f.bound = std::max(f.mean, largest);
  return f;
}

absl::Status Compare(const StepPlanData& p, const char* name, const Phase& want,
                     const PhaseSummary& got) {
  if (!Close(want.max, got.max) || !Close(want.mean, got.mean) ||
      !Close(want.bound, got.lower_bound)) {
    return Differs(p, absl::StrCat(name, " phase: plan reports max ", got.max, " mean ", got.mean,
                                   " bound ", got.lower_bound, ", the placement gives ", want.max,
                                   " / ", want.mean, " / ", want.bound));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AuditPlanAgainstJob(const Job& job, const StepPlanData& p) {
  const v1::JobConfig& cfg = job.config();
  const Index& ix = job.index();
  const uint32_t stage = job.StageIndex(p.step);
  const uint32_t seq_len = cfg.curriculum(static_cast<int>(stage)).seq_len();
  if (p.stage != stage || p.seq_len != seq_len) {
    return Differs(p, absl::StrCat("stage ", p.stage, " / seq_len ", p.seq_len,
                                   ", the config says ", stage, " / ", seq_len));
  }
  // The draw: text samples, then VL, in stream order.
  const uint64_t T = cfg.batch().text_samples_per_step(), V = cfg.batch().vl_samples_per_step();
  const auto& text_ids = job.text_samples();
  const auto& vl_ids = job.vl_samples();
  std::vector<uint32_t> drawn;
  drawn.reserve(T + V);
  if (T > 0) {
    StreamSampler s(cfg.seed(), Stream::kText, text_ids.size(), T);
    for (uint64_t k = 0; k < T; ++k) drawn.push_back(text_ids[s.At(p.step * T + k)]);
  }
  if (V > 0) {
    StreamSampler s(cfg.seed(), Stream::kVl, vl_ids.size(), V);
    for (uint64_t k = 0; k < V; ++k) drawn.push_back(vl_ids[s.At(p.step * V + k)]);
  }
  if (p.samples.size() != drawn.size()) {
    return Differs(p, absl::StrCat(p.samples.size(), " samples planned, ", drawn.size(), " drawn"));
  }
  std::vector<uint32_t> sorted = drawn;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return Differs(p, "the streams draw a sample twice");
  }
  const uint32_t W = cfg.world_size();
  const uint32_t text_seqs = job.text_seqs_per_rank(), vl_seqs = job.vl_seqs_per_rank();
  const uint32_t per_rank = text_seqs + vl_seqs;
  const uint32_t img_cap = cfg.batch().img_cap_tokens();
  std::vector<uint64_t> tokens(size_t{W} * per_rank, 0), images(size_t{W} * per_rank, 0);
  std::vector<double> llm(W, 0.0), vit(W, 0.0);
  double largest_llm = 0, largest_vit = 0;
  const StageCoster& coster = job.coster(stage);
  for (size_t k = 0; k < drawn.size(); ++k) {
    const PlannedSample& ps = p.samples[k];
    if (ps.sample != drawn[k]) {
      return Differs(
          p, absl::StrCat("position ", k, " holds sample ", ps.sample, ", the draw ", drawn[k]));
    }
    auto c = coster.Cost(ps.sample);
    if (!c.ok()) return Differs(p, std::string(c.status().message()));
    if (ps.vl != ix.is_vl(ps.sample) || ps.cost.llm_tokens != c->llm_tokens ||
        ps.cost.image_tokens != c->image_tokens || !Close(ps.cost.llm, c->llm) ||
        !Close(ps.cost.vit, c->vit)) {
      return Differs(p, absl::StrCat("sample ", ps.sample, " is planned with ", ps.cost.llm_tokens,
                                     " tokens / ", ps.cost.image_tokens,
                                     " image tokens, the index "
                                     "gives ",
                                     c->llm_tokens, " / ", c->image_tokens));
    }
    const bool in_vl_seq = ps.seq >= text_seqs;
    if (ps.rank >= W || ps.seq >= per_rank || in_vl_seq != ps.vl) {
      return Differs(p, absl::StrCat("sample ", ps.sample, (ps.vl ? " (VL)" : " (text)"),
                                     " sits in rank ", ps.rank, " sequence ", ps.seq));
    }
    const size_t slot = size_t{ps.rank} * per_rank + ps.seq;
    tokens[slot] += c->llm_tokens;
    images[slot] += c->image_tokens;
    llm[ps.rank] += c->llm;
    largest_llm = std::max(largest_llm, c->llm);
    largest_vit = std::max(largest_vit, c->vit);
  }
  for (size_t slot = 0; slot < tokens.size(); ++slot) {
    if (tokens[slot] > seq_len || (img_cap > 0 && images[slot] > img_cap)) {
      return Differs(p, absl::StrCat("rank ", slot / per_rank, " sequence ", slot % per_rank,
                                     " holds ", tokens[slot], " tokens and ", images[slot],
                                     " image tokens: seq_len ", seq_len, ", img_cap ", img_cap));
    }
  }
  for (const PlannedImage& im : p.images) {
    if (im.enc_rank >= W) return Differs(p, "an image is encoded outside the world");
    vit[im.enc_rank] += im.cost;
  }
  if (p.phases_from_dispatcher) return absl::OkStatus();
  if (absl::Status s = Compare(p, "LLM", Measure(llm, largest_llm), p.llm); !s.ok()) return s;
  // ViT bound: the largest sample when its images are encoded together, the
  // largest image when post-balancing deals them one by one.
  double largest_image = 0;
  for (const PlannedImage& im : p.images) largest_image = std::max(largest_image, im.cost);
  const Phase v = Measure(vit, job.post_balancing() ? largest_image : largest_vit);
  return Compare(p, "ViT", v, p.vit);
}

}  // namespace tutti::packer
