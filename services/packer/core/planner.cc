#include "services/packer/core/planner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status.h"
#include "services/packer/core/chunking.h"
#include "services/packer/core/exchange.h"
#include "services/packer/core/sampler.h"
#include "tutti/v1/common.pb.h"

namespace tutti::packer {
namespace {

// Stable counting sort of ids [0, n) into rows by key(id); key is called
// once per id (it reads large records). With `payload` (may be null),
// (*payload_out)[j] = payload(csr->items[j]) too, in the same pass.
template <typename Key, typename Payload>
void FillCsr(uint32_t n, uint32_t rows, Key key, Payload payload, Csr* csr,
             std::vector<uint32_t>* payload_out) {
  thread_local std::vector<uint32_t> keys, at, values;
  keys.resize(n);
  if (payload_out != nullptr) values.resize(n);
  csr->begin.assign(rows + 1, 0);
  for (uint32_t i = 0; i < n; ++i) {
    keys[i] = key(i);
    if (payload_out != nullptr) values[i] = payload(i);
    ++csr->begin[keys[i] + 1];
  }
  for (uint32_t r = 0; r < rows; ++r) csr->begin[r + 1] += csr->begin[r];
  at.assign(csr->begin.begin(), csr->begin.end() - 1);
  csr->items.resize(n);
  if (payload_out != nullptr) payload_out->resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t j = at[keys[i]]++;
    csr->items[j] = i;
    if (payload_out != nullptr) (*payload_out)[j] = values[i];
  }
}
template <typename Key>
void FillCsr(uint32_t n, uint32_t rows, Key key, Csr* csr) {
  FillCsr(
      n, rows, key, [](uint32_t) { return 0u; }, csr, nullptr);
}

PhaseSummary SummarizePhase(const std::vector<double>& per_rank, const std::vector<double>& before,
                            double largest_item) {
  PhaseSummary s;
  double sum = 0, sum_before = 0, max_before = 0;
  for (double v : per_rank) {
    sum += v;
    s.max = std::max(s.max, v);
  }
  for (double v : before) {
    sum_before += v;
    max_before = std::max(max_before, v);
  }
  const double n = per_rank.empty() ? 1 : per_rank.size();
  s.mean = sum / n;
  s.imbalance = s.mean > 0 ? s.max / s.mean : 1.0;
  s.lower_bound = std::max(s.mean, largest_item);
  const double mean_before = sum_before / n;
  s.imbalance_before = mean_before > 0 ? max_before / mean_before : 1.0;
  return s;
}

}  // namespace

absl::Status Planner::Draw(uint64_t step, StepPlanData* out) const {
  const Job& job = *job_;
  const v1::JobConfig& cfg = job.config();
  const Index& ix = job.index();
  const uint32_t stage = job.StageIndex(step);
  const StageCoster& coster = job.coster(stage);
  const CostModel& model = coster.model();
  const uint32_t T = cfg.batch().text_samples_per_step(), V = cfg.batch().vl_samples_per_step();
  const uint32_t W = job.world_size();
  const uint64_t n_text = job.text_samples().size(), n_vl = job.vl_samples().size();
  ASSIGN_OR_RETURN(DeferralQueue in, QueueEntering(step));
  // Candidates: each stream's waiting samples, oldest first, then the step's
  // own draw.
  const uint32_t NT = static_cast<uint32_t>(in.text.size()) + T;
  const uint32_t NV = static_cast<uint32_t>(in.vl.size()) + V;

  out->step = step;
  out->stage = stage;
  out->max_pixels = cfg.curriculum(stage).max_pixels();
  out->seq_len = cfg.curriculum(stage).seq_len();
  out->world_size = W;
  out->ranks_per_node = job.ranks_per_node();
  out->text_seqs = job.text_seqs_per_rank();
  out->vl_seqs = job.vl_seqs_per_rank();
  // Each stream cycles on its own (sampler.h): the epoch of each stream's
  // first sample of the step.
  out->text_epoch = T > 0 ? step * T / std::max<uint64_t>(n_text, 1) : 0;
  out->vl_epoch = V > 0 ? step * V / std::max<uint64_t>(n_vl, 1) : 0;
  out->epoch = T > 0 ? out->text_epoch : out->vl_epoch;

  out->samples.resize(NT + NV);
  out->images.clear();
  out->audio.clear();
  out->text_items.resize(NT);
  out->vl_items.resize(NV);
  const uint64_t elem = uint64_t{cfg.post_balancing().hidden_size()} *
                        static_cast<uint32_t>(DTypeSize(cfg.post_balancing().embedding_dtype()));
  const uint64_t pixel_row = job.pixel_row_bytes();
  const uint64_t audio_rate = cfg.audio().sample_rate();
  const uint64_t audio_max_samples = uint64_t{cfg.audio().max_seconds()} * audio_rate;

  // Sample ids first (pure arithmetic), then the index records with
  // prefetching: the draw is random access into a large index, so memory
  // latency, not arithmetic, is what costs here.
  StreamSampler text_sampler(cfg.seed(), Stream::kText, std::max<uint64_t>(n_text, 1), T);
  StreamSampler vl_sampler(cfg.seed(), Stream::kVl, std::max<uint64_t>(n_vl, 1), V);
  thread_local std::vector<uint32_t> ids;
  thread_local std::vector<uint64_t> pos, local;
  ids.resize(NT + NV);
  pos.resize(NT + NV);
  local.resize(NT + NV);
  CandidatePositions(step, T, V, in, pos.data());
  text_sampler.AtMany(pos.data(), NT, local.data());
  vl_sampler.AtMany(pos.data() + NT, NV, local.data() + NT);
  for (uint32_t k = 0; k < NT + NV; ++k) ids[k] = static_cast<uint32_t>(local[k]);
  constexpr uint32_t kAhead = 16;
  const uint32_t* text_ids = job.text_samples().data();
  const uint32_t* vl_ids = job.vl_samples().data();
  for (uint32_t k = 0; k < NT + NV; ++k) {
    if (k + kAhead < NT + NV)
      __builtin_prefetch((k + kAhead < NT ? text_ids : vl_ids) + ids[k + kAhead]);
    ids[k] = k < NT ? text_ids[ids[k]] : vl_ids[ids[k]];
  }
  for (uint32_t k = 0; k < std::min(NT + NV, kAhead); ++k) ix.PrefetchSample(ids[k]);
  for (uint32_t k = 0; k < NT + NV; ++k) {
    if (k + kAhead < NT + NV) ix.PrefetchSample(ids[k + kAhead]);
    if (k + kAhead / 2 < NT + NV && k + kAhead / 2 >= NT) {
      ix.PrefetchMedia(ids[k + kAhead / 2]);
      coster.PrefetchImages(ix.media_begin(ids[k + kAhead / 2]));
    }
    const bool vl = k >= NT;
    const uint32_t s = ids[k];
    PlannedSample& ps = out->samples[k];
    ps = PlannedSample();
    ps.sample = s;
    ps.shard = ix.ShardOf(s);
    ps.drawn_rank = k % W;
    ps.vl = vl;
    ps.position = pos[k];
    ps.drawn_step = pos[k] / (vl ? V : T);
    ps.first_image = static_cast<uint32_t>(out->images.size());
    ps.first_audio = static_cast<uint32_t>(out->audio.size());
    SampleCost& c = ps.cost;
    c.text_tokens = ix.text_tokens(s);
    uint64_t tokens = c.text_tokens;
    for (uint32_t j = ix.media_begin(s), e = ix.media_end(s); j < e; ++j) {
      if (ix.media_is_image(j)) {
        ImageGeometry geometry;
        if (!coster.ImageGeometryOf(j, &geometry)) {
          auto g = coster.Image(j);
          if (!g.ok()) {
            return absl::FailedPreconditionError(
                absl::StrCat("sample ", job.DescribeSample(s), ": ", g.status().message()));
          }
          geometry = *g;
        }
        const ImageGeometry* g = &geometry;
        PlannedImage& im = out->images.emplace_back();
        im.owner = k;
        im.media = j;
        im.image_index = c.images;
        im.height = g->height;
        im.width = g->width;
        im.grid_h = g->grid_h;
        im.grid_w = g->grid_w;
        im.patches = g->patches;
        im.llm_tokens = g->llm_tokens;
        im.cost = model.Vit(g->patches);
        im.output_bytes = g->llm_tokens * elem;
        im.input_bytes = g->patches * pixel_row;
        c.image_tokens += g->llm_tokens;
        c.patches += g->patches;
        c.vit += im.cost;
        tokens += g->llm_tokens + 2;
        ++c.images;
      } else {
        const uint32_t ms = ix.media_audio_ms(j);
        PlannedAudio& au = out->audio.emplace_back();
        au.owner = k;
        au.media = j;
        au.audio_index = c.audio;
        au.frames = (ms + 9) / 10;
        au.tokens = coster.AudioTokens(ms);
        au.cost = model.Audio(au.tokens);
        au.output_bytes = au.tokens * elem;
        // float32 samples, as the stager lays out audio_values.
        au.input_bytes =
            std::min<uint64_t>(uint64_t{ms} * audio_rate / 1000, audio_max_samples) * 4;
        c.audio_tokens += au.tokens;
        c.audio_cost += au.cost;
        tokens += au.tokens + 2;
        ++c.audio;
      }
    }
    c.llm_tokens = static_cast<uint32_t>(std::min<uint64_t>(tokens, UINT32_MAX));
    c.llm = model.Llm(c.llm_tokens);
    PackItem& item = vl ? out->vl_items[k - NT] : out->text_items[k];
    item.tokens = c.llm_tokens;
    item.image_tokens = c.image_tokens;
    item.vit = c.vit;
    item.llm = c.llm;
  }
  out->deferred_in = std::move(in);
  return Admit(out);
}

absl::Status Planner::Plan(uint64_t step, StepPlanData* out) const {
  const Job& job = *job_;
  RETURN_IF_ERROR(job.CheckStep(step));
  RETURN_IF_ERROR(Draw(step, out));
  DispatchStep in;
  in.model = &job.coster(out->stage).model();
  dispatch::ShardAvailability staging;
  if (staging_ != nullptr) staging = staging_->At(step);
  in.staging = &staging;
  absl::Status s = job.dispatcher().Dispatch(in, out);
  if (IsCapacityError(s)) {
    // The strategy could not pack what the step admitted; first-fit
    // decreasing can (overflow.h).
    out->overflow.fallback_packing = true;
    s = job.fallback_dispatcher().Dispatch(in, out);
  }
  if (!s.ok()) {
    return Annotate(
        s, absl::StrCat("step ", step, " (curriculum[", out->stage, "], seq_len ", out->seq_len,
                        ", max_pixels ", out->max_pixels, ", strategy ", job.plan_strategy(), ")"));
  }
  LayOutStep(job.config().batch().max_patches_per_chunk(), out);
  SummarizeStep(job.config().post_balancing().enabled(), out);
  return absl::OkStatus();
}

void LayOutStep(uint32_t max_patches_per_chunk, StepPlanData* out) {
  const uint32_t W = out->world_size;
  const uint32_t S = out->seqs_per_rank();
  FillCsr(
      static_cast<uint32_t>(out->samples.size()), W * S,
      [&](uint32_t k) { return out->samples[k].rank * S + out->samples[k].seq; }, &out->docs);
  thread_local std::vector<uint32_t> row_patches;  // enc_images' patches, in row order
  FillCsr(
      static_cast<uint32_t>(out->images.size()), W,
      [&](uint32_t i) { return out->images[i].enc_rank; },
      [&](uint32_t i) { return out->images[i].patches; }, &out->enc_images, &row_patches);
  FillCsr(
      static_cast<uint32_t>(out->audio.size()), W,
      [&](uint32_t i) { return out->audio[i].enc_rank; }, &out->enc_audio);
  BuildChunks(max_patches_per_chunk, row_patches.data(), out);
  BuildExchange(out);
  BuildLoadExchange(out);
}

void SummarizeStep(bool post, StepPlanData* out) {
  const uint32_t W = out->world_size;
  out->ranks.assign(W, RankTotals());
  thread_local std::vector<double> vit, llm, audio, vit_before, llm_before, audio_before;
  vit.assign(W, 0);
  llm.assign(W, 0);
  audio.assign(W, 0);
  vit_before.assign(W, 0);
  llm_before.assign(W, 0);
  audio_before.assign(W, 0);
  double largest_vit = 0, largest_llm = 0, largest_audio = 0;
  for (const PlannedSample& ps : out->samples) {
    RankTotals& r = out->ranks[ps.rank];
    r.llm += ps.cost.llm;
    r.llm_tokens += ps.cost.llm_tokens;
    r.image_tokens += ps.cost.image_tokens;
    ++r.samples;
    llm[ps.rank] += ps.cost.llm;
    llm_before[ps.drawn_rank] += ps.cost.llm;
    vit_before[ps.drawn_rank] += ps.cost.vit;
    audio_before[ps.drawn_rank] += ps.cost.audio_cost;
    largest_llm = std::max(largest_llm, ps.cost.llm);
    if (!post) {
      largest_vit = std::max(largest_vit, ps.cost.vit);
      largest_audio = std::max(largest_audio, ps.cost.audio_cost);
    }
  }
  for (const PlannedImage& im : out->images) {
    RankTotals& r = out->ranks[im.enc_rank];
    r.vit += im.cost;
    r.patches += im.patches;
    ++r.images;
    vit[im.enc_rank] += im.cost;
    if (post) largest_vit = std::max(largest_vit, im.cost);
  }
  for (const PlannedAudio& au : out->audio) {
    out->ranks[au.enc_rank].audio += au.cost;
    audio[au.enc_rank] += au.cost;
    if (post) largest_audio = std::max(largest_audio, au.cost);
  }
  out->has_audio = !out->audio.empty();
  if (out->phases_from_dispatcher) return;  // measured in the dispatcher's cost variant
  out->vit = SummarizePhase(vit, vit_before, largest_vit);
  out->llm = SummarizePhase(llm, llm_before, largest_llm);
  out->audio_phase = SummarizePhase(audio, audio_before, largest_audio);
}

}  // namespace tutti::packer
