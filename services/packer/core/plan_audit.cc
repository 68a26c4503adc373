#include "services/packer/core/plan_audit.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/packer/core/sampler.h"

namespace tutti::packer {
namespace {

absl::Status Differs(const StepPlanData& p, const std::string& what) {
  return absl::InternalError(absl::StrCat("step ", p.step, ": ", what));
}

bool Close(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max({1.0, a, b}); }

// Sample s's ViT cost under the step's constants: its images as the stage
// resizes them (an image that does not resize counts nothing; Cost refuses
// it first).
double VitCost(const Index& ix, const StageCoster& coster, const CostModel& model, uint32_t s) {
  double vit = 0;
  for (uint32_t j = ix.media_begin(s), e = ix.media_end(s); j < e; ++j) {
    if (!ix.media_is_image(j)) continue;
    if (auto g = coster.Image(j); g.ok()) vit += model.Vit(g->patches);
  }
  return vit;
}

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
  // The draw: text samples, then VL, each stream's positions ascending:
  // the queue it entered with, then its own.
  const uint64_t per[2] = {cfg.batch().text_samples_per_step(), cfg.batch().vl_samples_per_step()};
  // What the streams give at every position the plan names (Job::DrawSamples).
  std::vector<uint64_t> named[2];
  for (const PlannedSample& ps : p.samples) named[ps.vl].push_back(ps.position);
  std::vector<uint32_t> given[2];
  std::vector<uint8_t> given_source[2];
  for (int v = 0; v < 2; ++v) {
    given[v].resize(named[v].size());
    given_source[v].resize(named[v].size());
    job.DrawSamples(v == 1, named[v].data(), named[v].size(), given[v].data(),
                    given_source[v].data());
  }
  size_t at[2] = {0, 0};
  const std::vector<uint64_t>* queued[2] = {&p.deferred_in.text, &p.deferred_in.vl};
  const std::vector<uint64_t>* deferred[2] = {&p.deferred_out.text, &p.deferred_out.vl};
  const std::vector<uint64_t>* skipped[2] = {&p.skipped_text, &p.skipped_vl};
  const uint64_t H = job.overflow().max_deferred_steps;
  std::vector<uint64_t> accounted[2];
  uint64_t last[2] = {0, 0};
  bool any[2] = {false, false};
  bool in_vl = false;
  for (size_t k = 0; k < p.samples.size(); ++k) {
    const PlannedSample& ps = p.samples[k];
    const int v = ps.vl;
    if (ps.vl != ix.is_vl(ps.sample) || (in_vl && !ps.vl)) {
      return Differs(p, absl::StrCat("sample ", ps.sample, " at ", k, " is out of stream order"));
    }
    in_vl = ps.vl;
    const size_t g = at[v]++;
    if (ps.sample != given[v][g] || ps.source != given_source[v][g]) {
      return Differs(p, absl::StrCat("sample ", ps.sample, " (source ", ps.source,
                                     ") is planned at stream position ", ps.position,
                                     ", where the stream gives sample ", given[v][g], " (source ",
                                     given_source[v][g], ")"));
    }
    if (ps.piece > 0) continue;  // the first piece stands for its document
    const uint64_t pos = ps.position, drawn = per[v] ? pos / per[v] : 0;
    if (drawn > p.step || drawn + H < p.step || (any[v] && pos <= last[v])) {
      return Differs(p, absl::StrCat("sample ", ps.sample, " is planned at stream position ", pos,
                                     " (drawn at step ", drawn,
                                     "), which the stream or the order does not give it"));
    }
    if (drawn < p.step && !std::binary_search(queued[v]->begin(), queued[v]->end(), pos)) {
      return Differs(p, absl::StrCat("sample ", ps.sample, " of step ", drawn,
                                     " is planned but was not waiting"));
    }
    any[v] = true;
    last[v] = pos;
    accounted[v].push_back(pos);
  }
  for (int v = 0; v < 2; ++v) {
    for (const std::vector<uint64_t>* list : {deferred[v], skipped[v]}) {
      accounted[v].insert(accounted[v].end(), list->begin(), list->end());
    }
    std::vector<uint64_t> want(queued[v]->begin(), queued[v]->end());
    for (uint64_t j = 0; j < per[v]; ++j) want.push_back(p.step * per[v] + j);
    std::sort(want.begin(), want.end());
    std::sort(accounted[v].begin(), accounted[v].end());
    if (want != accounted[v]) {
      return Differs(p, absl::StrCat(v ? "VL" : "text", " stream: ", accounted[v].size(),
                                     " positions planned, deferred or skipped for ", want.size(),
                                     " drawn or waiting"));
    }
  }
  std::vector<uint64_t> sorted;
  for (const PlannedSample& ps : p.samples) sorted.push_back(uint64_t{ps.sample} << 32 | ps.piece);
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
  const CostModel model(p.cost);  // the config's, or the fit the step was planned with
  // Pieces add up to their document: (sample -> tokens, text, image tokens).
  std::vector<std::tuple<uint32_t, uint64_t, uint64_t, uint64_t>> pieces;
  for (size_t k = 0; k < p.samples.size(); ++k) {
    const PlannedSample& ps = p.samples[k];
    auto c = coster.Cost(ps.sample);
    if (!c.ok()) return Differs(p, std::string(c.status().message()));
    const bool truncated = c->llm_tokens > seq_len && ps.truncated && ps.pieces == 0 &&
                           ps.cost.llm_tokens == seq_len &&
                           ps.cost.text_tokens + (c->llm_tokens - c->text_tokens) == seq_len;
    const bool whole = ps.pieces == 0 && !ps.truncated && ps.cost.llm_tokens == c->llm_tokens;
    if (ps.pieces > 0) {
      if (ps.piece == 0) pieces.emplace_back(ps.sample, 0, 0, 0);
      auto& [s, tokens, text, images] = pieces.back();
      tokens += ps.cost.llm_tokens;
      text += ps.cost.text_tokens;
      images += ps.cost.image_tokens;
      if (ps.piece + 1 == ps.pieces &&
          (s != ps.sample || tokens != c->llm_tokens || text != c->text_tokens ||
           images != c->image_tokens || c->llm_tokens <= seq_len)) {
        return Differs(p, absl::StrCat("the pieces of sample ", ps.sample, " hold ", tokens,
                                       " tokens, the document ", c->llm_tokens));
      }
    }
    if ((!whole && !truncated && ps.pieces == 0) ||
        (whole && (ps.cost.image_tokens != c->image_tokens ||
                   !Close(ps.cost.vit, VitCost(ix, coster, model, ps.sample)))) ||
        ps.cost.llm_tokens > seq_len || !Close(ps.cost.llm, model.Llm(ps.cost.llm_tokens))) {
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
    tokens[slot] += ps.cost.llm_tokens;
    images[slot] += ps.cost.image_tokens;
    llm[ps.rank] += ps.cost.llm;
    largest_llm = std::max(largest_llm, ps.cost.llm);
    largest_vit = std::max(largest_vit, ps.cost.vit);
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
