#include "services/packer/core/dispatcher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "services/packer/core/post_balancing/post_balancing.h"

namespace tutti::packer {
namespace {

class ColocatedDispatcher final : public Dispatcher {
 public:
  ColocatedDispatcher(const PackingStrategy* strategy, const DispatcherOptions& o)
      : strategy_(strategy), o_(o) {}

  const std::string& name() const override { return name_; }

  // Loads happen on the sample's LLM rank; the staging map is not consulted.
  absl::Status Dispatch(const DispatchStep&, StepPlanData* plan) const override {
    PackProblem p;
    p.ranks = o_.world_size;
    p.seq_len = plan->seq_len;
    p.img_cap = o_.img_cap;
    p.text_seqs_per_rank = plan->text_seqs;
    p.vl_seqs_per_rank = plan->vl_seqs;
    p.text = plan->text_items;
    p.vl = plan->vl_items;
    p.balance_vit = true;
    thread_local PackResult r;
    if (absl::Status s = strategy_->Pack(p, &r); !s.ok()) return s;
    const uint32_t T = static_cast<uint32_t>(plan->text_items.size());
    for (uint32_t k = 0; k < plan->samples.size(); ++k) {
      PlannedSample& ps = plan->samples[k];
      if (k < T) {
        ps.rank = r.text_slot[k] / plan->text_seqs;
        ps.seq = r.text_slot[k] % plan->text_seqs;
      } else {
        ps.rank = r.vl_slot[k - T] / plan->vl_seqs;
        ps.seq = plan->text_seqs + r.vl_slot[k - T] % plan->vl_seqs;
      }
      ps.text_remote = false;
      ps.text_source = ps.rank;
    }
    for (PlannedImage& im : plan->images) {
      im.enc_rank = im.load_source = plan->samples[im.owner].rank;
      im.remote_load = false;
    }
    for (PlannedAudio& au : plan->audio) {
      au.enc_rank = au.load_source = plan->samples[au.owner].rank;
      au.remote_load = false;
    }
    plan->phases_from_dispatcher = false;
    plan->rearrangement.clear();
    return absl::OkStatus();
  }

 private:
  const std::string name_ = "colocated";
  const PackingStrategy* strategy_;
  DispatcherOptions o_;
};

PhaseSummary ToSummary(const dispatch::PhaseStats& s) {
  PhaseSummary out;
  out.max = s.max;
  out.mean = s.mean;
  out.imbalance = s.imbalance;
  out.lower_bound = s.lower_bound;
  out.imbalance_before = s.imbalance_before;
  return out;
}

class PostBalancingDispatcher final : public Dispatcher {
 public:
  explicit PostBalancingDispatcher(const DispatcherOptions& o) {
    base_.cluster = {o.world_size, o.ranks_per_node};
    base_.slots.text_micro_batches = o.text_micro_batches;
    base_.slots.text_micro_batch = o.text_micro_batch;
    base_.slots.vl_micro_batches = o.vl_micro_batches;
    base_.slots.vl_micro_batch = o.vl_micro_batch;
    base_.padded = o.padded;
    base_.rearrangement = o.rearrangement;
    base_.hidden_size = o.hidden_size;
    base_.embedding_dtype_bytes = o.embedding_dtype_bytes;
    base_.token_id_bytes = kTokenIdBytes;
    base_.build_exchanges = false;  // the planner lays out its own lists
  }

  const std::string& name() const override { return name_; }

  absl::Status Dispatch(const DispatchStep& step, StepPlanData* plan) const override {
    constexpr int kV = static_cast<int>(dispatch::EncoderKind::kVision);
    constexpr int kA = static_cast<int>(dispatch::EncoderKind::kAudio);
    // The step as the dispatcher's input (buffers reused across steps).
    thread_local dispatch::DispatchInput in;
    in.availability = step.staging != nullptr ? *step.staging : dispatch::ShardAvailability();
    const uint32_t n = static_cast<uint32_t>(plan->samples.size());
    in.samples.resize(n);
    for (uint32_t k = 0; k < n; ++k) {
      const PlannedSample& ps = plan->samples[k];
      dispatch::Sample& s = in.samples[k];
      // The position in the global batch: a step that spans an epoch
      // boundary may draw an index sample twice, and the dispatcher wants
      // every document's id distinct.
      s.sample_id = k;
      s.shard = ps.shard;
      s.drawn_rank = ps.drawn_rank;
      s.vl = ps.vl;
      s.llm_tokens = ps.cost.llm_tokens;
      s.text_tokens = ps.cost.text_tokens;
      s.items[kV].clear();
      s.items[kA].clear();
    }
    for (const PlannedImage& im : plan->images) {
      dispatch::EncoderItem it;
      it.index = im.image_index;
      it.units = im.patches;
      it.output_tokens = im.llm_tokens;
      it.input_bytes = im.input_bytes;
      it.height = im.height;
      it.width = im.width;
      it.grid_t = 1;
      it.grid_h = im.grid_h;
      it.grid_w = im.grid_w;
      in.samples[im.owner].items[kV].push_back(it);
    }
    for (const PlannedAudio& au : plan->audio) {
      dispatch::EncoderItem it;
      it.index = au.audio_index;
      it.units = au.tokens;
      it.output_tokens = au.tokens;
      it.input_bytes = au.input_bytes;
      it.frames = au.frames;
      in.samples[au.owner].items[kA].push_back(it);
    }
    dispatch::DispatchOptions o = base_;
    o.slots.seq_len = plan->seq_len;
    o.cost = step.model->options();
    absl::StatusOr<dispatch::DispatchPlan> d = dispatch::Dispatch(in, o);
    if (!d.ok()) {
      // Samples that do not fit their sequences: the planner's contract says
      // FAILED_PRECONDITION for a step that cannot be planned.
      if (absl::IsResourceExhausted(d.status()) || absl::IsInvalidArgument(d.status())) {
        return absl::FailedPreconditionError(
            absl::StrCat("post-balancing: ", d.status().message()));
      }
      return d.status();
    }
    // Items were flattened in batch order (sample, then position), which is
    // the order of plan->images and plan->audio.
    for (uint32_t k = 0; k < n; ++k) {
      PlannedSample& ps = plan->samples[k];
      ps.rank = d->llm_rank[k];
      ps.seq = d->llm_seq[k];
      ps.text_remote = d->text_remote[k] != 0;
      ps.text_source = d->text_source[k];
    }
    const dispatch::EncoderPhasePlan& vision = d->encoders[kV];
    for (size_t i = 0; i < plan->images.size(); ++i) {
      PlannedImage& im = plan->images[i];
      im.enc_rank = vision.rank[i];
      im.remote_load = vision.remote_load[i] != 0;
      im.load_source = vision.load_source[i];
    }
    const dispatch::EncoderPhasePlan& audio = d->encoders[kA];
    for (size_t a = 0; a < plan->audio.size(); ++a) {
      PlannedAudio& au = plan->audio[a];
      au.enc_rank = audio.rank[a];
      au.remote_load = audio.remote_load[a] != 0;
      au.load_source = audio.load_source[a];
    }
    plan->phases_from_dispatcher = true;
    plan->vit = plan->audio_phase = plan->llm = PhaseSummary();
    for (const dispatch::PhaseStats& s : d->stats.phases) {
      (s.phase == "vit"     ? plan->vit
       : s.phase == "audio" ? plan->audio_phase
                            : plan->llm) = ToSummary(s);
    }
    plan->rearrangement = d->stats.rearrangement;
    return absl::OkStatus();
  }

 private:
  const std::string name_ = "post-balancing";
  dispatch::DispatchOptions base_;
};

}  // namespace

std::unique_ptr<Dispatcher> MakeColocatedDispatcher(const PackingStrategy* strategy,
                                                    const DispatcherOptions& options) {
  return std::make_unique<ColocatedDispatcher>(strategy, options);
}

std::unique_ptr<Dispatcher> MakePostBalancingDispatcher(const DispatcherOptions& options) {
  return std::make_unique<PostBalancingDispatcher>(options);
}

uint64_t IlpBinaries(const DispatcherOptions& o, uint64_t text_samples, uint64_t vl_samples) {
  return uint64_t{o.world_size} * (text_samples * o.text_micro_batches * o.text_micro_batch +
                                   vl_samples * o.vl_micro_batches * o.vl_micro_batch);
}

}  // namespace tutti::packer
