#include "services/packer/core/planner.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status.h"
#include "services/packer/core/chunking.h"
#include "services/packer/core/exchange.h"
#include "services/packer/core/radix_sort.h"
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

// A candidate's index records (ReadSamples), by draw position.
struct DrawnSample {
  uint32_t sample, shard, text_tokens;
  uint32_t media_at, media_count;  // its media: DrawnMedium [media_at, + media_count)
};
// An image (value: its packed grid at the stage, StageCoster::Grid) or audio
// clip (value: its duration in ms) of a candidate.
struct DrawnMedium {
  uint32_t media, value;
  bool image;
};

// The candidates as (sample id << 32 | draw position), ascending: `local`
// holds the NT text candidates' then the NV VL candidates' stream-local
// indices; each stream's ids list ascends, so sorting by local index sorts
// by sample id, and the two streams merge.
void SampleOrder(const uint64_t* local, uint32_t NT, uint32_t NV,
                 absl::Span<const uint32_t> text_ids, absl::Span<const uint32_t> vl_ids,
                 std::vector<uint64_t>* order) {
  thread_local std::vector<uint64_t> text, vl, tmp;
  auto sorted = [&](const uint64_t* l, uint32_t n, uint32_t first, absl::Span<const uint32_t> ids,
                    std::vector<uint64_t>* v) {
    v->resize(n);
    for (uint32_t i = 0; i < n; ++i) (*v)[i] = l[i] << 32 | (first + i);
    SortByUpper32(ids.size(), v, &tmp);
    for (uint64_t& e : *v) e = uint64_t{ids[e >> 32]} << 32 | static_cast<uint32_t>(e);
  };
  sorted(local, NT, 0, text_ids, &text);
  sorted(local + NT, NV, NT, vl_ids, &vl);
  order->resize(size_t{NT} + NV);
  std::merge(text.begin(), text.end(), vl.begin(), vl.end(), order->begin());
}

// The index records of the candidates, read in `order` (SampleOrder: the
// index's arrays are read ascending), into (*drawn)[draw position] and
// *media (in the order read).
void ReadSamples(const Index& ix, const StageCoster& coster, const std::vector<uint64_t>& order,
                 std::vector<DrawnSample>* drawn, std::vector<DrawnMedium>* media) {
  const size_t n = order.size();
  drawn->resize(n);
  media->clear();
  if (n == 0) return;
  // Ascending reads, but sparse ones: fetched ahead all the same. The shard
  // follows the ascending ids (the last shard starting at or before each).
  constexpr size_t kAhead = 16;
  uint32_t shard = ix.ShardOf(static_cast<uint32_t>(order[0] >> 32));
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      ix.PrefetchSample(static_cast<uint32_t>(order[i + kAhead] >> 32));
      __builtin_prefetch(drawn->data() + static_cast<uint32_t>(order[i + kAhead]), 1);
    }
    if (i + kAhead / 2 < n) {
      const uint32_t ahead = static_cast<uint32_t>(order[i + kAhead / 2] >> 32);
      ix.PrefetchMedia(ahead);
      coster.PrefetchGrid(ix.media_begin(ahead));
    }
    const uint64_t e = order[i];
    const uint32_t s = static_cast<uint32_t>(e >> 32);
    DrawnSample& d = (*drawn)[static_cast<uint32_t>(e)];
    while (shard + 1 < ix.num_shards() && ix.shard(shard + 1).first_sample <= s) ++shard;
    d.sample = s;
    d.shard = shard;
    d.text_tokens = ix.text_tokens(s);
    const uint32_t begin = ix.media_begin(s), end = ix.media_end(s);
    d.media_at = static_cast<uint32_t>(media->size());
    d.media_count = end - begin;
    for (uint32_t j = begin; j < end; ++j) {
      const bool image = ix.media_is_image(j);
      media->push_back(DrawnMedium{j, image ? coster.Grid(j) : ix.media_audio_ms(j), image});
    }
  }
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

// Per-rank totals and the phases' loads, accumulated record by record:
// samples, then images, then audio clips, each in batch order.
class Summary {
 public:
  Summary(bool post, StepPlanData* out) : post_(post), out_(out) {
    const uint32_t W = out->world_size;
    out->ranks.assign(W, RankTotals());
    for (std::vector<double>* v :
         {&b_.vit, &b_.llm, &b_.audio, &b_.vit_before, &b_.llm_before, &b_.audio_before}) {
      v->assign(W, 0);
    }
  }
  void Add(const PlannedSample& ps) {
    RankTotals& r = out_->ranks[ps.rank];
    r.llm += ps.cost.llm;
    r.llm_tokens += ps.cost.llm_tokens;
    r.image_tokens += ps.cost.image_tokens;
    ++r.samples;
    b_.llm[ps.rank] += ps.cost.llm;
    b_.llm_before[ps.drawn_rank] += ps.cost.llm;
    b_.vit_before[ps.drawn_rank] += ps.cost.vit;
    b_.audio_before[ps.drawn_rank] += ps.cost.audio_cost;
    largest_llm_ = std::max(largest_llm_, ps.cost.llm);
    if (!post_) {
      largest_vit_ = std::max(largest_vit_, ps.cost.vit);
      largest_audio_ = std::max(largest_audio_, ps.cost.audio_cost);
    }
  }
  void Add(const PlannedImage& im) {
    RankTotals& r = out_->ranks[im.enc_rank];
    r.vit += im.cost;
    r.patches += im.patches;
    ++r.images;
    b_.vit[im.enc_rank] += im.cost;
    if (post_) largest_vit_ = std::max(largest_vit_, im.cost);
  }
  void Add(const PlannedAudio& au) {
    out_->ranks[au.enc_rank].audio += au.cost;
    b_.audio[au.enc_rank] += au.cost;
    if (post_) largest_audio_ = std::max(largest_audio_, au.cost);
  }
  // After every record: the phase summaries.
  void Finish() {
    out_->has_audio = !out_->audio.empty();
    if (out_->phases_from_dispatcher) return;  // measured in the dispatcher's cost variant
    out_->vit = SummarizePhase(b_.vit, b_.vit_before, largest_vit_);
    out_->llm = SummarizePhase(b_.llm, b_.llm_before, largest_llm_);
    out_->audio_phase = SummarizePhase(b_.audio, b_.audio_before, largest_audio_);
  }

 private:
  struct Buffers {
    std::vector<double> vit, llm, audio, vit_before, llm_before, audio_before;
  };
  static thread_local Buffers buffers_;
  const bool post_;
  StepPlanData* const out_;
  Buffers& b_ = buffers_;
  double largest_vit_ = 0, largest_llm_ = 0, largest_audio_ = 0;
};
thread_local Summary::Buffers Summary::buffers_;

// LayOutStep, and with `summary` (may be null) the summary's pass in the
// same reads of the records; the load exchange only when a load is remote.
void LayOut(uint32_t max_patches_per_chunk, Summary* summary, StepPlanData* out) {
  const uint32_t W = out->world_size;
  const uint32_t S = out->seqs_per_rank();
  const uint32_t I = static_cast<uint32_t>(out->images.size());
  const uint32_t A = static_cast<uint32_t>(out->audio.size());
  bool remote = false;
  FillCsr(
      static_cast<uint32_t>(out->samples.size()), W * S,
      [&](uint32_t k) {
        const PlannedSample& ps = out->samples[k];
        if (summary != nullptr) summary->Add(ps);
        remote |= ps.text_remote;
        return ps.rank * S + ps.seq;
      },
      &out->docs);
  // Every encoder item's encoder and LLM rank (the exchange), and the
  // images' patches in row order (the chunks).
  thread_local std::vector<uint32_t> row_patches, enc, llm, image_patches;
  enc.resize(I + A);
  llm.resize(I + A);
  image_patches.resize(I);
  FillCsr(
      I, W,
      [&](uint32_t i) {
        const PlannedImage& im = out->images[i];
        if (summary != nullptr) summary->Add(im);
        remote |= im.remote_load;
        enc[i] = im.enc_rank;
        llm[i] = out->samples[im.owner].rank;
        image_patches[i] = im.patches;
        return im.enc_rank;
      },
      [&](uint32_t i) { return image_patches[i]; }, &out->enc_images, &row_patches);
  FillCsr(
      A, W,
      [&](uint32_t a) {
        const PlannedAudio& au = out->audio[a];
        if (summary != nullptr) summary->Add(au);
        remote |= au.remote_load;
        enc[I + a] = au.enc_rank;
        llm[I + a] = out->samples[au.owner].rank;
        return au.enc_rank;
      },
      &out->enc_audio);
  BuildExchange(enc.data(), llm.data(), out);
  if (out->items_move) {  // the encoder rows now follow the sends
    // From the images' patches in image order (4 bytes an image, not a
    // record read at random).
    for (size_t k = 0; k < row_patches.size(); ++k) {
      row_patches[k] = image_patches[out->enc_images.items[k]];
    }
  }
  BuildChunks(max_patches_per_chunk, row_patches.data(), out);
  if (remote) {
    BuildLoadExchange(out);
  } else {
    ClearLoadExchange(out);
  }
}

}  // namespace

absl::Status Planner::Draw(uint64_t step, StepPlanData* out) const {
  const Job& job = *job_;
  const v1::JobConfig& cfg = job.config();
  const Index& ix = job.index();
  const uint32_t stage = job.StageIndex(step);
  const StageCoster& coster = job.coster(stage);
  out->cost = coster.model().options();
  out->cost_fit = 0;
  out->cost_fit_from = 0;
  if (costs_ != nullptr) {
    if (const std::optional<CostFitEntry> fit = costs_->ForStep(step)) {
      out->cost = fit->cost;
      out->cost_fit = fit->id;
      out->cost_fit_from = fit->from_step;
    }
  }
  const CostModel model(out->cost);
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
  // With a mixture a stream's epoch is its sources' epochs together.
  const Mixture* mixture = job.mixture();
  const uint64_t epoch_text = mixture ? mixture->epoch_samples(false) : n_text;
  const uint64_t epoch_vl = mixture ? mixture->epoch_samples(true) : n_vl;
  out->text_epoch = T > 0 ? step * T / std::max<uint64_t>(epoch_text, 1) : 0;
  out->vl_epoch = V > 0 ? step * V / std::max<uint64_t>(epoch_vl, 1) : 0;
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

  // Three passes: the candidates' stream-local indices (pure arithmetic);
  // the index records of the candidates in sample-id order, which makes the
  // reads of the index ascending instead of random (the draw is otherwise
  // bound by memory latency), into compact per-candidate records; then the
  // plan's records in draw order.
  thread_local std::vector<uint64_t> pos, local, order;
  thread_local std::vector<uint8_t> sources;
  pos.resize(NT + NV);
  sources.resize(NT + NV);
  CandidatePositions(step, T, V, in, pos.data());
  if (mixture == nullptr) {
    StreamSampler text_sampler(cfg.seed(), Stream::kText, std::max<uint64_t>(n_text, 1), T);
    StreamSampler vl_sampler(cfg.seed(), Stream::kVl, std::max<uint64_t>(n_vl, 1), V);
    local.resize(NT + NV);
    text_sampler.AtMany(pos.data(), NT, local.data());
    vl_sampler.AtMany(pos.data() + NT, NV, local.data() + NT);
    SampleOrder(local.data(), NT, NV, job.text_samples(), job.vl_samples(), &order);
    std::fill(sources.begin(), sources.begin() + NT, 0);
    std::fill(sources.begin() + NT, sources.end(), 1);
  } else {
    // The sources' draw gives sample ids, sorted here as SampleOrder does.
    thread_local std::vector<uint32_t> ids;
    thread_local std::vector<uint64_t> tmp;
    ids.resize(NT + NV);
    job.DrawSamples(false, pos.data(), NT, ids.data(), sources.data());
    job.DrawSamples(true, pos.data() + NT, NV, ids.data() + NT, sources.data() + NT);
    order.resize(size_t{NT} + NV);
    for (uint32_t k = 0; k < NT + NV; ++k) order[k] = uint64_t{ids[k]} << 32 | k;
    SortByUpper32(ix.num_samples(), &order, &tmp);
  }
  thread_local std::vector<DrawnSample> drawn;
  thread_local std::vector<DrawnMedium> media;
  ReadSamples(ix, coster, order, &drawn, &media);
  DrawnAdmission& admission = BeginAdmission(*out);
  constexpr uint32_t kAhead = 16;
  // The round-robin deal's rank (k % W), without a division.
  uint32_t drawn_rank = 0;
  for (uint32_t k = 0; k < NT + NV; ++k, drawn_rank = drawn_rank + 1 == W ? 0 : drawn_rank + 1) {
    if (k + kAhead < NT + NV) {
      __builtin_prefetch(media.data() + drawn[k + kAhead].media_at);
      // The records written next, fetched for writing ahead of the stores
      // (they were last written a step ago: out of the caches by now).
      const char* next = reinterpret_cast<const char*>(out->samples.data() + k + kAhead);
      __builtin_prefetch(next, 1);
      __builtin_prefetch(next + 64, 1);
      if (out->images.size() + kAhead < out->images.capacity()) {
        __builtin_prefetch(out->images.data() + out->images.size() + kAhead, 1);
      }
    }
    const bool vl = k >= NT;
    const DrawnSample& d = drawn[k];
    const uint32_t s = d.sample;
    PlannedSample& ps = out->samples[k];
    ps = PlannedSample();
    ps.sample = s;
    ps.shard = d.shard;
    ps.drawn_rank = drawn_rank;
    ps.vl = vl;
    ps.source = sources[k];
    ps.position = pos[k];
    ps.first_image = static_cast<uint32_t>(out->images.size());
    ps.first_audio = static_cast<uint32_t>(out->audio.size());
    SampleCost& c = ps.cost;
    c.text_tokens = d.text_tokens;
    uint64_t tokens = c.text_tokens;
    for (const DrawnMedium *m = media.data() + d.media_at, *e = m + d.media_count; m < e; ++m) {
      const uint32_t j = m->media;
      if (m->image) {
        ImageGeometry geometry;
        if (!coster.GeometryOfGrid(m->value, &geometry)) {
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
        const uint32_t ms = m->value;
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
    AddAdmissionCandidate(admission, k, *out);
  }
  out->deferred_in = std::move(in);
  return Admit(out);
}

absl::Status Planner::Plan(uint64_t step, StepPlanData* out) const {
  const Job& job = *job_;
  RETURN_IF_ERROR(job.CheckStep(step));
  RETURN_IF_ERROR(Draw(step, out));
  DispatchStep in;
  const CostModel model(out->cost);
  in.model = &model;
  dispatch::ShardAvailability staging;
  if (staging_ != nullptr) {
    staging = staging_->At(step);
    in.staging = &staging;
  } else if (job.homes() != nullptr) {
    in.staging = &job.homes()->At(step);
  } else {
    in.staging = &staging;
  }
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
  Summary summary(job.config().post_balancing().enabled(), out);
  LayOut(job.config().batch().max_patches_per_chunk(), &summary, out);
  summary.Finish();
  out->step_shards.clear();
  if (job.homes() != nullptr) ListStepShards(job.index().num_shards(), out);
  return absl::OkStatus();
}

void LayOutStep(uint32_t max_patches_per_chunk, StepPlanData* out) {
  LayOut(max_patches_per_chunk, nullptr, out);
}

void SummarizeStep(bool post, StepPlanData* out) {
  Summary summary(post, out);
  for (const PlannedSample& ps : out->samples) summary.Add(ps);
  for (const PlannedImage& im : out->images) summary.Add(im);
  for (const PlannedAudio& au : out->audio) summary.Add(au);
  summary.Finish();
}

void ListStepShards(uint32_t num_shards, StepPlanData* out) {
  out->step_shards.clear();
  std::vector<bool> seen(num_shards, false);
  for (const PlannedSample& ps : out->samples) {
    if (ps.shard < num_shards && !seen[ps.shard]) {
      seen[ps.shard] = true;
      out->step_shards.push_back(ps.shard);
    }
  }
}

}  // namespace tutti::packer
