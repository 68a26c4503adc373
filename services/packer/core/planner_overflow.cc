// The planner's overflow stage (planner.h, overflow.h): long documents,
// admission of each stream's certainly packable prefix, the deferral queue
// and its recovery from a bounded window.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "services/packer/core/overflow.h"
#include "services/packer/core/planner.h"
#include "services/packer/core/sampler.h"

namespace tutti::packer {
namespace {

// One stream's candidates for admission: their items' certificate sizes
// (candidate c holds sizes[begin[c], begin[c + 1])) and sample ids.
struct StreamCandidates {
  std::vector<uint32_t> sizes, begin{0};
  std::vector<uint32_t> ids;
  void Clear() {
    sizes.clear();
    begin.assign(1, 0);
    ids.clear();
  }
};

// The items of one document: one, unless it is longer than seq_len.
// `runs`: its image runs, then its audio runs (LLM tokens with markers);
// the first `image_runs` are images.
LongDocOutcome AddCandidate(const PackCertificate& cert, uint32_t seq_len, LongDocuments policy,
                            uint32_t sample, uint32_t llm_tokens, uint32_t image_tokens,
                            uint32_t text_tokens, absl::Span<const uint32_t> runs,
                            uint32_t image_runs, std::vector<DocPiece>* pieces,
                            StreamCandidates* c) {
  c->ids.push_back(sample);
  LongDocOutcome outcome = LongDocOutcome::kWhole;
  if (llm_tokens <= seq_len) {
    c->sizes.push_back(cert.Size(llm_tokens, image_tokens));
  } else {
    outcome = ShapeDocument(text_tokens, runs, seq_len, policy, pieces);
    if (outcome != LongDocOutcome::kSkipped) {
      for (const DocPiece& p : *pieces) {
        uint32_t images = 0;
        for (uint32_t r = p.first_run; r < p.first_run + p.runs && r < image_runs; ++r) {
          images += runs[r] - 2;
        }
        c->sizes.push_back(cert.Size(p.tokens, images));
      }
    }
  }
  c->begin.push_back(static_cast<uint32_t>(c->sizes.size()));
  return outcome;
}

// How many of a stream's candidates the step admits: the longest prefix
// that certainly packs, ending before the first sample that came twice (a
// deferred sample whose next epoch's draw is already due waits one more
// step). `queued`: candidates from the queue (only they can repeat).
uint32_t Admitted(const PackCertificate& cert, const StreamCandidates& c, size_t queued) {
  uint32_t limit = static_cast<uint32_t>(c.ids.size());
  if (queued > 0) {
    std::vector<std::pair<uint32_t, uint32_t>> seen;  // (sample, candidate)
    seen.reserve(c.ids.size());
    for (uint32_t i = 0; i < c.ids.size(); ++i) seen.emplace_back(c.ids[i], i);
    std::sort(seen.begin(), seen.end());
    for (size_t i = 1; i < seen.size(); ++i) {
      if (seen[i].first == seen[i - 1].first) limit = std::min(limit, seen[i].second);
    }
  }
  return cert.LongestPrefix(c.sizes, absl::MakeConstSpan(c.begin).subspan(0, limit + 1));
}

}  // namespace

absl::StatusOr<DeferralQueue> Planner::QueueEntering(uint64_t step) const {
  const OverflowPolicy& policy = job_->overflow();
  const uint32_t H = policy.max_deferred_steps;
  const uint64_t start = step > H ? step - H : 0;
  DeferralQueue q;
  uint32_t run = 0;  // consecutive steps entered with a non-empty queue
  for (uint64_t j = start; j < step; ++j) {
    ASSIGN_OR_RETURN(q, Transition(j, q));
    run = q.empty() ? 0 : run + 1;
  }
  const auto& b = job_->config().batch();
  const uint64_t max_samples = policy.max_deferred_samples > 0
                                   ? policy.max_deferred_samples
                                   : uint64_t{b.text_samples_per_step()} + b.vl_samples_per_step();
  if (run >= H || q.size() > max_samples) {
    const uint64_t oldest = std::min(
        q.text.empty() ? UINT64_MAX : q.text.front() / std::max(1u, b.text_samples_per_step()),
        q.vl.empty() ? UINT64_MAX : q.vl.front() / std::max(1u, b.vl_samples_per_step()));
    return absl::ResourceExhaustedError(absl::StrCat(
        "step ", step, ": the data cannot keep up with the constraints: ", q.text.size(),
        " text and ", q.vl.size(),
        " VL samples are still waiting from earlier steps (the oldest "
        "drawn at step ",
        oldest, "), ",
        run >= H ? absl::StrCat("and the queue has not emptied for ", H,
                                " steps (overflow.max_deferred_steps)")
                 : absl::StrCat("above overflow.max_deferred_samples ", max_samples),
        "; draw fewer samples per step (batch.text_samples_per_step / vl_samples_per_step), "
        "raise seq_len or batch.img_cap_tokens, or give the sequences more room"));
  }
  return q;
}

absl::StatusOr<DeferralQueue> Planner::Transition(uint64_t step, const DeferralQueue& in) const {
  {
    absl::MutexLock lock(&mu_);
    auto it = transitions_.find(step);
    if (it != transitions_.end()) {
      for (const auto& [from, to] : it->second) {
        if (from == in) return to;
      }
    }
  }
  const Job& job = *job_;
  const v1::JobConfig& cfg = job.config();
  const Index& ix = job.index();
  const uint32_t stage = job.StageIndex(step);
  const StageCoster& coster = job.coster(stage);
  const uint32_t seq_len = cfg.curriculum(static_cast<int>(stage)).seq_len();
  const uint32_t T = cfg.batch().text_samples_per_step(), V = cfg.batch().vl_samples_per_step();
  const uint32_t W = job.world_size();
  const LongDocuments policy = job.overflow().long_documents;
  std::vector<uint64_t> pos(in.size() + T + V);
  CandidatePositions(step, T, V, in, pos.data());
  DeferralQueue out;
  std::vector<uint32_t> runs;
  std::vector<DocPiece> pieces;
  StreamCandidates c;
  size_t at = 0;
  for (const bool vl : {false, true}) {
    const size_t queued = vl ? in.vl.size() : in.text.size();
    const size_t n = queued + (vl ? V : T);
    const PackCertificate cert(W * (vl ? job.vl_seqs_per_rank() : job.text_seqs_per_rank()),
                               seq_len, vl ? cfg.batch().img_cap_tokens() : 0);
    const auto& stream = vl ? job.vl_samples() : job.text_samples();
    StreamSampler sampler(cfg.seed(), vl ? Stream::kVl : Stream::kText,
                          std::max<uint64_t>(stream.size(), 1), vl ? V : T);
    c.Clear();
    for (size_t i = 0; i < n; ++i) {
      const uint32_t s = stream[sampler.At(pos[at + i])];
      ASSIGN_OR_RETURN(SampleCost cost, coster.Cost(s));
      runs.clear();
      uint32_t image_runs = 0;
      if (cost.llm_tokens > seq_len)
        RETURN_IF_ERROR(DocumentRuns(coster, ix, s, &runs, &image_runs));
      AddCandidate(cert, seq_len, policy, s, cost.llm_tokens, cost.image_tokens, cost.text_tokens,
                   runs, image_runs, &pieces, &c);
    }
    const uint32_t admitted = Admitted(cert, c, queued);
    (vl ? out.vl : out.text).assign(pos.begin() + at + admitted, pos.begin() + at + n);
    at += n;
  }
  Remember(step, in, out);
  return out;
}

void Planner::Remember(uint64_t step, const DeferralQueue& in, const DeferralQueue& out) const {
  const uint64_t keep = 4 * uint64_t{job_->overflow().max_deferred_steps} + 64;
  absl::MutexLock lock(&mu_);
  auto& v = transitions_[step];
  for (const auto& [from, to] : v) {
    if (from == in) return;
  }
  if (v.size() >= 4) v.erase(v.begin());
  v.emplace_back(in, out);
  while (transitions_.size() > keep) {
    // Drop the step furthest from this one.
    auto first = transitions_.begin(), last = std::prev(transitions_.end());
    transitions_.erase(step - first->first > last->first - step ? first : last);
  }
}

absl::Status Planner::Admit(StepPlanData* out) const {
  const Job& job = *job_;
  const v1::JobConfig& cfg = job.config();
  const uint32_t seq_len = out->seq_len;
  const uint32_t W = out->world_size;
  const LongDocuments policy = job.overflow().long_documents;
  const CostModel& model = job.coster(out->stage).model();
  const uint32_t NT = static_cast<uint32_t>(out->text_items.size());
  const uint32_t N = static_cast<uint32_t>(out->samples.size());
  const DeferralQueue& in = out->deferred_in;
  // Per candidate: its outcome and (for split and truncated ones) pieces.
  thread_local std::vector<LongDocOutcome> outcome;
  thread_local std::vector<std::vector<DocPiece>> shaped;
  thread_local std::vector<uint32_t> runs;
  outcome.assign(N, LongDocOutcome::kWhole);
  if (shaped.size() < N) shaped.resize(N);
  bool reshape = false;
  uint32_t admitted[2] = {0, 0};
  thread_local StreamCandidates c;
  for (const bool vl : {false, true}) {
    const uint32_t begin = vl ? NT : 0, end = vl ? N : NT;
    const PackCertificate cert(W * (vl ? out->vl_seqs : out->text_seqs), seq_len,
                               vl ? cfg.batch().img_cap_tokens() : 0);
    c.Clear();
    for (uint32_t k = begin; k < end; ++k) {
      const PlannedSample& ps = out->samples[k];
      runs.clear();
      if (ps.cost.llm_tokens > seq_len) {
        for (uint32_t i = 0; i < ps.cost.images; ++i) {
          runs.push_back(out->images[ps.first_image + i].llm_tokens + 2);
        }
        for (uint32_t i = 0; i < ps.cost.audio; ++i) {
          runs.push_back(out->audio[ps.first_audio + i].tokens + 2);
        }
      }
      outcome[k] =
          AddCandidate(cert, seq_len, policy, ps.sample, ps.cost.llm_tokens, ps.cost.image_tokens,
                       ps.cost.text_tokens, runs, ps.cost.images, &shaped[k], &c);
      reshape |= outcome[k] != LongDocOutcome::kWhole;
    }
    admitted[vl] = Admitted(cert, c, vl ? in.vl.size() : in.text.size());
    reshape |= admitted[vl] < end - begin;
  }
  OverflowCounts& n = out->overflow;
  n = OverflowCounts();
  out->deferred_out.text.clear();
  out->deferred_out.vl.clear();
  out->skipped_text.clear();
  out->skipped_vl.clear();
  n.deferred_in = std::min<uint32_t>(admitted[0], in.text.size()) +
                  std::min<uint32_t>(admitted[1], in.vl.size());
  if (!reshape) {
    Remember(out->step, in, out->deferred_out);
    return absl::OkStatus();
  }
  // Rebuild the arrays: admitted candidates as their pieces, the rest waits.
  std::vector<PlannedSample> samples;
  std::vector<PlannedImage> images;
  std::vector<PlannedAudio> audio;
  std::vector<PackItem> text_items, vl_items;
  samples.reserve(N);
  images.reserve(out->images.size());
  audio.reserve(out->audio.size());
  for (uint32_t k = 0; k < N; ++k) {
    const PlannedSample& ps = out->samples[k];
    const bool vl = k >= NT;
    const uint32_t index = vl ? k - NT : k;
    if (index >= admitted[vl]) {
      (vl ? out->deferred_out.vl : out->deferred_out.text).push_back(ps.position);
      continue;
    }
    if (outcome[k] == LongDocOutcome::kSkipped) {
      (vl ? out->skipped_vl : out->skipped_text).push_back(ps.position);
      ++n.skipped;
      continue;
    }
    const std::vector<DocPiece> whole = {DocPiece{0, uint32_t{ps.cost.images} + ps.cost.audio, 0,
                                                  ps.cost.text_tokens, ps.cost.llm_tokens}};
    const std::vector<DocPiece>& pieces = outcome[k] == LongDocOutcome::kWhole ? whole : shaped[k];
    if (outcome[k] == LongDocOutcome::kSplit) {
      ++n.split_documents;
      n.split_pieces += static_cast<uint32_t>(pieces.size());
    }
    n.truncated += outcome[k] == LongDocOutcome::kTruncated;
    for (uint32_t p = 0; p < pieces.size(); ++p) {
      const DocPiece& piece = pieces[p];
      const uint32_t owner = static_cast<uint32_t>(samples.size());
      PlannedSample q = ps;
      q.drawn_rank = owner % W;
      q.first_image = static_cast<uint32_t>(images.size());
      q.first_audio = static_cast<uint32_t>(audio.size());
      q.truncated = outcome[k] == LongDocOutcome::kTruncated;
      if (outcome[k] == LongDocOutcome::kSplit) {
        q.piece = p;
        q.pieces = static_cast<uint32_t>(pieces.size());
      }
      q.text_begin = piece.text_begin;
      SampleCost& cost = q.cost;
      cost = SampleCost();
      cost.text_tokens = piece.text_tokens;
      for (uint32_t r = piece.first_run; r < piece.first_run + piece.runs; ++r) {
        if (r < ps.cost.images) {
          PlannedImage im = out->images[ps.first_image + r];
          im.owner = owner;
          cost.image_tokens += im.llm_tokens;
          cost.patches += im.patches;
          cost.vit += im.cost;
          ++cost.images;
          images.push_back(im);
        } else {
          PlannedAudio au = out->audio[ps.first_audio + (r - ps.cost.images)];
          au.owner = owner;
          cost.audio_tokens += au.tokens;
          cost.audio_cost += au.cost;
          ++cost.audio;
          audio.push_back(au);
        }
      }
      cost.llm_tokens = piece.tokens;
      cost.llm = model.Llm(piece.tokens);
      samples.push_back(q);
      PackItem item;
      item.tokens = cost.llm_tokens;
      item.image_tokens = cost.image_tokens;
      item.vit = cost.vit;
      item.llm = cost.llm;
      (vl ? vl_items : text_items).push_back(item);
    }
  }
  out->samples = std::move(samples);
  out->images = std::move(images);
  out->audio = std::move(audio);
  out->text_items = std::move(text_items);
  out->vl_items = std::move(vl_items);
  n.deferred_out = static_cast<uint32_t>(out->deferred_out.size());
  const auto& b = cfg.batch();
  if (!out->deferred_out.empty()) {
    n.oldest_deferred_step =
        std::min(out->deferred_out.text.empty()
                     ? UINT64_MAX
                     : out->deferred_out.text.front() / std::max(1u, b.text_samples_per_step()),
                 out->deferred_out.vl.empty()
                     ? UINT64_MAX
                     : out->deferred_out.vl.front() / std::max(1u, b.vl_samples_per_step()));
  }
  Remember(out->step, in, out->deferred_out);
  return absl::OkStatus();
}

}  // namespace tutti::packer
