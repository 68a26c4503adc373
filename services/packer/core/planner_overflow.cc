// The planner's overflow stage (planner.h, overflow.h): long documents,
// admission of each stream's certainly packable prefix, the deferral queue
// and its recovery from a bounded window.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "services/packer/core/overflow.h"
#include "services/packer/core/planner.h"
#include "services/packer/core/radix_sort.h"
#include "services/packer/core/sampler.h"

namespace tutti::packer {

// One stream's candidates for admission: their items' certificate sizes and
// items (tokens and image tokens; candidate c holds sizes[begin[c],
// begin[c + 1])) and sample ids. Only candidates below the frontier need
// their items (the lead of a step, AdmitStream): those a step draws itself
// keep none (with_items false), since the step's own arrays hold them.
struct StreamCandidates {
  std::vector<uint32_t> sizes, begin{0};
  std::vector<PackItem> items;
  std::vector<uint32_t> ids;
  bool with_items = true;
  void Clear(bool keep_items = true) {
    sizes.clear();
    begin.assign(1, 0);
    items.clear();
    ids.clear();
    with_items = keep_items;
  }
  uint32_t size() const { return static_cast<uint32_t>(ids.size()); }
  // Appends `o`'s candidates.
  void Append(const StreamCandidates& o) {
    const uint32_t base = static_cast<uint32_t>(sizes.size());
    sizes.insert(sizes.end(), o.sizes.begin(), o.sizes.end());
    items.insert(items.end(), o.items.begin(), o.items.end());
    ids.insert(ids.end(), o.ids.begin(), o.ids.end());
    for (size_t c = 1; c < o.begin.size(); ++c) begin.push_back(base + o.begin[c]);
  }
};

namespace {

// The items of one document: one, unless it is longer than seq_len.
// `doc`: its runs in the order of its token stream (read only then).
LongDocOutcome AddCandidate(const PackCertificate& cert, uint32_t seq_len, LongDocuments policy,
                            uint32_t sample, uint32_t llm_tokens, uint32_t image_tokens,
                            uint32_t text_tokens, const DocumentLayout& doc,
                            std::vector<DocPiece>* pieces, StreamCandidates* c) {
  c->ids.push_back(sample);
  LongDocOutcome outcome = LongDocOutcome::kWhole;
  auto add = [&](uint32_t tokens, uint32_t images) {
    c->sizes.push_back(cert.Size(tokens, images));
    if (c->with_items) {
      PackItem item;
      item.tokens = tokens;
      item.image_tokens = images;
      c->items.push_back(item);
    }
  };
  if (llm_tokens <= seq_len) {
    add(llm_tokens, image_tokens);
  } else {
    outcome = ShapeDocumentStream(text_tokens, doc, seq_len, policy, pieces);
    if (outcome != LongDocOutcome::kSkipped) {
      for (const DocPiece& p : *pieces) {
        uint32_t images = 0;
        for (uint32_t r = p.first_run; r < p.first_run + p.runs; ++r) {
          if (doc.medium[r] < doc.images) images += doc.runs[r] - 2;
        }
        add(p.tokens, images);
      }
    }
  }
  c->begin.push_back(static_cast<uint32_t>(c->sizes.size()));
  return outcome;
}

// The first candidate at or after `a` whose sample already came in [a, it)
// (a waiting sample whose next epoch's draw is due), or c.size(). `own`:
// whether [a, end) is the step's own draw alone, which never repeats a
// sample (sampler.h).
uint32_t RepeatLimit(const StreamCandidates& c, uint32_t a, bool own) {
  const uint32_t n = c.size();
  if (own) return n;
  // A bit per sample id (an index of millions of samples: a few hundred
  // KB), set as the candidates come and cleared after.
  thread_local std::vector<uint64_t> seen;
  uint32_t limit = a;
  for (; limit < n; ++limit) {
    const uint32_t s = c.ids[limit];
    if (s / 64 >= seen.size()) seen.resize(s / 64 + 1, 0);
    const uint64_t bit = uint64_t{1} << (s % 64);
    if (seen[s / 64] & bit) break;
    seen[s / 64] |= bit;
  }
  for (uint32_t i = a; i < limit; ++i) seen[c.ids[i] / 64] = 0;
  return limit;
}

// The sizes and offsets of candidates [a, e) of c.
void Window(const StreamCandidates& c, uint32_t a, uint32_t e, absl::Span<const uint32_t>* sizes,
            std::vector<uint32_t>* begin) {
  begin->clear();
  for (uint32_t i = a; i <= e; ++i) begin->push_back(c.begin[i] - c.begin[a]);
  *sizes = absl::MakeConstSpan(c.sizes).subspan(c.begin[a], c.begin[e] - c.begin[a]);
}

// The window start at or below position f (overflow.h): each step's draw of
// `per` positions cut into parts of q.
uint64_t WindowStartAtOrBelow(uint64_t f, uint64_t per, uint64_t q) {
  return f / per * per + f % per / q * q;
}
uint64_t WindowStartBelow(uint64_t g, uint64_t per, uint64_t q) {
  if (g % per > 0) return g - q;
  return WindowStartAtOrBelow(g - 1, per, q);
}

}  // namespace

absl::Status Planner::CostPositions(uint64_t step, bool vl, uint64_t lo, uint64_t hi,
                                    StreamCandidates* c) const {
  const Job& job = *job_;
  const v1::JobConfig& cfg = job.config();
  const Index& ix = job.index();
  const uint32_t stage = job.StageIndex(step);
  const StageCoster& coster = job.coster(stage);
  const uint32_t seq_len = cfg.curriculum(static_cast<int>(stage)).seq_len();
  const uint32_t per = vl ? cfg.batch().vl_samples_per_step() : cfg.batch().text_samples_per_step();
  const PackCertificate cert = Certificate(step, vl);
  DocumentLayout doc;
  std::vector<DocPiece> pieces;
  // The samples of [lo, hi) in one batch (Job::DrawSamples).
  const uint32_t n = static_cast<uint32_t>(hi - lo);
  thread_local std::vector<uint64_t> positions;
  thread_local std::vector<uint32_t> ids;
  thread_local std::vector<uint8_t> sources;
  positions.resize(n);
  ids.resize(n);
  sources.resize(n);
  for (uint64_t p = lo; p < hi; ++p) positions[p - lo] = p;
  job.DrawSamples(vl, positions.data(), n, ids.data(), sources.data());
  (void)per;
  // Their costs in sample-id order, so that the index is read ascending as
  // the draw reads it (Planner::Draw) instead of at random; the candidates
  // then follow in position order. A costing that fails is reported for the
  // first position it fails at, as a walk in position order would.
  struct Costed {
    uint32_t llm_tokens, image_tokens, text_tokens;
  };
  thread_local std::vector<uint64_t> order, tmp;
  thread_local std::vector<Costed> costed;
  order.resize(n);
  for (uint32_t i = 0; i < n; ++i) order[i] = uint64_t{ids[i]} << 32 | i;
  SortByUpper32(ix.num_samples(), &order, &tmp);
  costed.resize(n);
  uint32_t failed = n;
  absl::Status failure;
  constexpr uint32_t kAhead = 16;
  for (uint32_t k = 0; k < n; ++k) {
    if (k + kAhead < n) ix.PrefetchSample(static_cast<uint32_t>(order[k + kAhead] >> 32));
    if (k + kAhead / 2 < n) {
      const uint32_t ahead = static_cast<uint32_t>(order[k + kAhead / 2] >> 32);
      ix.PrefetchMedia(ahead);
      coster.PrefetchGrid(ix.media_begin(ahead));
    }
    const uint32_t i = static_cast<uint32_t>(order[k]);
    absl::StatusOr<SampleCost> cost = coster.Cost(static_cast<uint32_t>(order[k] >> 32));
    if (!cost.ok()) {
      if (i < failed) failed = i, failure = cost.status();
      continue;
    }
    costed[i] = Costed{cost->llm_tokens, cost->image_tokens, cost->text_tokens};
  }
  for (uint32_t i = 0; i < n; ++i) {
    if (i == failed) return failure;
    const uint32_t s = ids[i];
    const Costed& cost = costed[i];
    doc.Clear();
    if (cost.llm_tokens > seq_len) RETURN_IF_ERROR(DocumentRuns(coster, ix, s, &doc));
    AddCandidate(cert, seq_len, job.long_documents(sources[i]), s, cost.llm_tokens,
                 cost.image_tokens, cost.text_tokens, doc, &pieces, c);
  }
  return absl::OkStatus();
}

PackCertificate Planner::Certificate(uint64_t step, bool vl) const {
  const Job& job = *job_;
  const v1::JobConfig& cfg = job.config();
  const uint32_t stage = job.StageIndex(step);
  return PackCertificate(
      job.world_size() * (vl ? job.vl_seqs_per_rank() : job.text_seqs_per_rank()),
      cfg.curriculum(static_cast<int>(stage)).seq_len(), vl ? cfg.batch().img_cap_tokens() : 0);
}

absl::StatusOr<StreamAdmission> Planner::AdmitStream(uint64_t step, bool vl, uint64_t f,
                                                     const StreamCandidates* drawn,
                                                     std::vector<PackItem>* lead) const {
  if (lead != nullptr) lead->clear();
  if (drawn == nullptr) {
    absl::MutexLock lock(&mu_);
    auto it = transitions_.find(step);
    if (it != transitions_.end()) {
      for (const TransitionEntry& e : it->second) {
        if (e.vl == vl && e.from == f) return e.to;
      }
    }
  }
  const v1::JobConfig& cfg = job_->config();
  const uint64_t per = vl ? cfg.batch().vl_samples_per_step() : cfg.batch().text_samples_per_step();
  const uint64_t end = (step + 1) * per;
  StreamAdmission a{f, f};
  if (per == 0 || f >= end) return a;
  const PackCertificate cert = Certificate(step, vl);
  const uint32_t bins = cert.bins();
  // The window: candidates of positions [lo, end); at first the step's own.
  thread_local StreamCandidates own, below, merged;
  // Items are kept only for a lead (candidates below f).
  const bool with_items = lead != nullptr;
  const StreamCandidates* c = drawn;
  if (c == nullptr) {
    own.Clear(with_items);
    RETURN_IF_ERROR(CostPositions(step, vl, f, end, &own));
    c = &own;
  }
  uint64_t lo = f;
  thread_local std::vector<uint32_t> begin;
  absl::Span<const uint32_t> sizes;
  // The bound's prefix from f.
  {
    const uint32_t limit = RepeatLimit(*c, 0, f >= step * per);
    Window(*c, 0, limit, &sizes, &begin);
    a.frontier = f + cert.LongestPrefix(sizes, begin);
  }
  // First-fit windows from the window starts at or below f.
  const uint64_t q = std::max<uint64_t>(1, (per + kWindowStarts - 1) / kWindowStarts);
  const uint64_t whole = uint64_t{bins} * PackCertificate::kUnit;
  for (uint64_t g = WindowStartAtOrBelow(f, per, q); a.frontier < end;
       g = WindowStartBelow(g, per, q)) {
    if (g < lo) {
      // Extend the window down to g (at least doubling what lies below f).
      const uint64_t want = 2 * std::max<uint64_t>(f - lo, q);
      const uint64_t new_lo = std::min(g, f > want ? f - want : 0);
      below.Clear(with_items);
      RETURN_IF_ERROR(CostPositions(step, vl, new_lo, lo, &below));
      below.Append(*c);
      std::swap(merged, below);  // below is cleared before its next use
      c = &merged;
      lo = new_lo;
    }
    const uint32_t at = static_cast<uint32_t>(g - lo);
    // An upper bound on what first-fit packs from g: the volume, one large
    // item per bin, no repeat. Each only falls as g does.
    uint32_t u = RepeatLimit(*c, at, g >= step * per);
    uint64_t volume = 0, large = 0;
    for (uint32_t i = at; i < u; ++i) {
      uint64_t v = 0, l = 0;
      for (uint32_t k = c->begin[i]; k < c->begin[i + 1]; ++k) {
        v += c->sizes[k];
        l += c->sizes[k] > PackCertificate::kUnit / 2;
      }
      if (volume + v > whole || large + l > bins) {
        u = i;
        break;
      }
      volume += v;
      large += l;
    }
    if (lo + u <= a.frontier) break;
    Window(*c, at, u, &sizes, &begin);
    const uint64_t reach = g + FirstFitPrefix(sizes, begin, bins);
    if (reach > a.frontier) a = StreamAdmission{reach, g};
    if (g == 0) break;
  }
  if (lead != nullptr && a.lead < f) {
    // Candidates below f came from CostPositions, with their items.
    const uint32_t from = c->begin[a.lead - lo], to = c->begin[f - lo];
    if (to > c->items.size()) {
      return absl::InternalError(
          absl::StrCat("step ", step, ": admission lost the items of its lead"));
    }
    lead->assign(c->items.begin() + from, c->items.begin() + to);
  }
  absl::MutexLock lock(&mu_);
  auto& v = transitions_[step];
  bool known = false;
  for (const TransitionEntry& e : v) known |= e.vl == vl && e.from == f;
  if (!known) {
    if (v.size() >= 16) v.erase(v.begin());
    v.push_back(TransitionEntry{vl, f, a});
  }
  while (transitions_.size() > kRememberedSteps) {
    auto first = transitions_.begin(), last = std::prev(transitions_.end());
    transitions_.erase(step - first->first > last->first - step ? first : last);
  }
  return a;
}

absl::StatusOr<Frontier> Planner::Advance(uint64_t step, const Frontier& in) const {
  ASSIGN_OR_RETURN(StreamAdmission t, AdmitStream(step, false, in.text, nullptr, nullptr));
  ASSIGN_OR_RETURN(StreamAdmission v, AdmitStream(step, true, in.vl, nullptr, nullptr));
  return Frontier{t.frontier, v.frontier};
}

absl::Status Planner::CheckEntering(uint64_t step, const Frontier& f) const {
  const OverflowPolicy& policy = job_->overflow();
  const auto& b = job_->config().batch();
  const uint64_t T = b.text_samples_per_step(), V = b.vl_samples_per_step();
  const uint64_t text = step * T - f.text, vl = step * V - f.vl;
  const uint64_t max_samples =
      policy.max_deferred_samples > 0 ? policy.max_deferred_samples : T + V;
  const uint64_t oldest =
      std::min(text > 0 ? f.text / T : UINT64_MAX, vl > 0 ? f.vl / V : UINT64_MAX);
  const bool too_old = oldest != UINT64_MAX && step - oldest > policy.max_deferred_steps;
  if (!too_old && text + vl <= max_samples) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "step ", step, ": the data cannot keep up with the constraints: ", text, " text and ", vl,
      " VL samples are still waiting from earlier steps (the oldest drawn at step ", oldest, "), ",
      too_old ? absl::StrCat("one has waited more than ", policy.max_deferred_steps,
                             " steps (overflow.max_deferred_steps)")
              : absl::StrCat("above overflow.max_deferred_samples ", max_samples),
      "; draw fewer samples per step (batch.text_samples_per_step / vl_samples_per_step), "
      "raise seq_len or batch.img_cap_tokens, or give the sequences more room"));
}

void Planner::RememberFrontier(uint64_t step, const Frontier& f) const {
  absl::MutexLock lock(&mu_);
  known_[step] = f;
  while (known_.size() > kRememberedSteps) {
    auto first = known_.begin(), last = std::prev(known_.end());
    known_.erase(step - first->first > last->first - step ? first : last);
  }
}

// The frontier entering `step`. Known frontiers (a previous step's
// admission, or an earlier recovery) are walked forward. Otherwise the
// recovery brackets the true frontier: a job that reached step s without
// stopping has at s at most max_deferred_samples waiting, none drawn more
// than max_deferred_steps steps before, so its frontier lies between the
// lowest such (`low`) and s x per (nothing waiting, `high`). Admission is
// monotone in the frontier, so the two replays keep the truth between them
// (the low one raised to the same floor at each step); from the step where
// they meet they are the truth. Without a meeting by `step`, the replay
// starts twice as far back, down to step 0 (nothing waits).
absl::StatusOr<Frontier> Planner::FrontierEntering(uint64_t step) const {
  if (step == 0) return Frontier{};
  const OverflowPolicy& policy = job_->overflow();
  const auto& b = job_->config().batch();
  const uint64_t T = b.text_samples_per_step(), V = b.vl_samples_per_step();
  const uint64_t H = policy.max_deferred_steps;
  const uint64_t max_samples =
      policy.max_deferred_samples > 0 ? policy.max_deferred_samples : T + V;
  uint64_t from = 0;
  Frontier f;
  bool found = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = known_.upper_bound(step);
    if (it != known_.begin()) {
      --it;
      if (it->first == step) return it->second;
      if (step - it->first <= 4 * H + 64) {
        from = it->first;
        f = it->second;
        found = true;
      }
    }
  }
  auto floor = [&](uint64_t s, uint64_t per) {
    const uint64_t drawn = s * per;
    return std::max(s > H ? (s - H) * per : 0, drawn > max_samples ? drawn - max_samples : 0);
  };
  if (!found) {
    for (uint64_t span = 2 * H + 2;; span *= 2) {
      const uint64_t s = step > span ? step - span : 0;
      Frontier low{floor(s, T), floor(s, V)}, high{s * T, s * V};
      uint64_t j = s;
      while (j < step && !(low == high)) {
        ASSIGN_OR_RETURN(low, Advance(j, low));
        ASSIGN_OR_RETURN(high, Advance(j, high));
        ++j;
        low.text = std::max(low.text, floor(j, T));
        low.vl = std::max(low.vl, floor(j, V));
      }
      if (low == high) {
        from = j;
        f = high;
        break;
      }
      if (s == 0) {
        return absl::InternalError(absl::StrCat("step ", step,
                                                ": the deferral queue could not "
                                                "be recovered from step 0"));
      }
    }
    RETURN_IF_ERROR(CheckEntering(from, f));
    RememberFrontier(from, f);
  }
  for (uint64_t j = from; j < step; ++j) {
    ASSIGN_OR_RETURN(f, Advance(j, f));
    RETURN_IF_ERROR(CheckEntering(j + 1, f));
    RememberFrontier(j + 1, f);
  }
  return f;
}

absl::StatusOr<DeferralQueue> Planner::QueueEntering(uint64_t step) const {
  ASSIGN_OR_RETURN(Frontier f, FrontierEntering(step));
  const auto& b = job_->config().batch();
  DeferralQueue q;
  for (uint64_t p = f.text; p < step * b.text_samples_per_step(); ++p) q.text.push_back(p);
  for (uint64_t p = f.vl; p < step * b.vl_samples_per_step(); ++p) q.vl.push_back(p);
  return q;
}

// Admit's candidates of the step being drawn, added by Draw as it costs
// them (BeginAdmission, AddAdmissionCandidate): per candidate its outcome
// and (for split and truncated ones) pieces and which medium each of its
// runs is (DocumentLayout::medium); each stream's candidates.
struct DrawnAdmission {
  std::vector<LongDocOutcome> outcome;
  std::vector<std::vector<DocPiece>> shaped;
  std::vector<std::vector<uint32_t>> medium;
  DocumentLayout doc;
  std::vector<MediaPlace> order;
  StreamCandidates c[2];
  PackCertificate cert[2] = {PackCertificate(0, 1, 0), PackCertificate(0, 1, 0)};
  bool reshape = false;
};

namespace {
thread_local DrawnAdmission drawn_admission;
}  // namespace

DrawnAdmission& Planner::BeginAdmission(const StepPlanData& out) const {
  DrawnAdmission& a = drawn_admission;
  const uint32_t N = static_cast<uint32_t>(out.samples.size());
  a.outcome.assign(N, LongDocOutcome::kWhole);
  if (a.shaped.size() < N) a.shaped.resize(N), a.medium.resize(N);
  a.reshape = false;
  for (const bool vl : {false, true}) {
    a.c[vl].Clear(/*keep_items=*/false);
    a.cert[vl] = Certificate(out.step, vl);
  }
  return a;
}

void Planner::AddAdmissionCandidate(DrawnAdmission& a, uint32_t k, const StepPlanData& out) const {
  const bool vl = k >= out.text_items.size();
  const uint32_t seq_len = out.seq_len;
  const PlannedSample& ps = out.samples[k];
  if (ps.cost.llm_tokens <= seq_len) {  // whole: one item (AddCandidate's first case)
    StreamCandidates& c = a.c[vl];
    c.ids.push_back(ps.sample);
    c.sizes.push_back(a.cert[vl].Size(ps.cost.llm_tokens, ps.cost.image_tokens));
    c.begin.push_back(static_cast<uint32_t>(c.sizes.size()));
    return;  // outcome[k] is kWhole from BeginAdmission
  }
  // Longer than seq_len: shaped from its runs in the order of its token
  // stream (the index's media order; the images and audio clips drawn are
  // the sample's, in member order).
  job_->index().MediaOrder(ps.sample, &a.order);
  a.doc.Clear();
  a.doc.images = ps.cost.images;
  for (const MediaPlace& m : a.order) {
    const uint32_t tokens = m.image ? out.images[ps.first_image + m.index].llm_tokens
                                    : out.audio[ps.first_audio + m.index].tokens;
    a.doc.Add(tokens + 2, m.text_at, m.image ? m.index : ps.cost.images + m.index);
  }
  a.medium[k] = a.doc.medium;
  a.outcome[k] = AddCandidate(a.cert[vl], seq_len, job_->long_documents(ps.source), ps.sample,
                              ps.cost.llm_tokens, ps.cost.image_tokens, ps.cost.text_tokens, a.doc,
                              &a.shaped[k], &a.c[vl]);
  a.reshape |= a.outcome[k] != LongDocOutcome::kWhole;
}

absl::Status Planner::Admit(StepPlanData* out) const {
  const Job& job = *job_;
  const v1::JobConfig& cfg = job.config();
  const uint32_t W = out->world_size;
  const CostModel model(out->cost);
  const uint32_t NT = static_cast<uint32_t>(out->text_items.size());
  const uint32_t N = static_cast<uint32_t>(out->samples.size());
  const DeferralQueue& in = out->deferred_in;
  DrawnAdmission& drawn = drawn_admission;
  const std::vector<LongDocOutcome>& outcome = drawn.outcome;
  const std::vector<std::vector<DocPiece>>& shaped = drawn.shaped;
  const std::vector<std::vector<uint32_t>>& medium = drawn.medium;
  bool reshape = drawn.reshape;
  uint32_t admitted[2] = {0, 0};
  Frontier next;
  for (const bool vl : {false, true}) {
    const uint32_t begin = vl ? NT : 0, end = vl ? N : NT;
    const StreamCandidates& c = drawn.c[vl];
    const std::vector<uint64_t>& queued = vl ? in.vl : in.text;
    const uint64_t per =
        vl ? cfg.batch().vl_samples_per_step() : cfg.batch().text_samples_per_step();
    const uint64_t f = queued.empty() ? out->step * per : queued.front();
    ASSIGN_OR_RETURN(StreamAdmission a,
                     AdmitStream(out->step, vl, f, &c, vl ? &out->vl_lead : &out->text_lead));
    admitted[vl] = static_cast<uint32_t>(a.frontier - f);
    (vl ? next.vl : next.text) = a.frontier;
    reshape |= admitted[vl] < end - begin;
  }
  if (CheckEntering(out->step + 1, next).ok()) RememberFrontier(out->step + 1, next);
  OverflowCounts& n = out->overflow;
  n = OverflowCounts();
  out->deferred_out.text.clear();
  out->deferred_out.vl.clear();
  out->skipped_text.clear();
  out->skipped_vl.clear();
  n.deferred_in = std::min<uint32_t>(admitted[0], in.text.size()) +
                  std::min<uint32_t>(admitted[1], in.vl.size());
  if (!reshape) return absl::OkStatus();
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
      // Its runs as the sample's images, then audio clips (each kind in
      // member order, as the stream holds them).
      thread_local std::vector<uint32_t> held;
      held.clear();
      for (uint32_t r = piece.first_run; r < piece.first_run + piece.runs; ++r) {
        held.push_back(outcome[k] == LongDocOutcome::kWhole ? r : medium[k][r]);
      }
      std::sort(held.begin(), held.end());
      for (const uint32_t r : held) {
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
  return absl::OkStatus();
}

}  // namespace tutti::packer
