#include "tools/sim/ladder.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_config.h"
#include "common/status.h"
#include "services/packer/core/job.h"
#include "services/packer/core/planner.h"
#include "tools/sim/step_work.h"

namespace tutti::sim {
namespace {

double QuantileOf(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}

// Images, audio clips and VL samples of the index.
struct Modalities {
  uint64_t text = 0, vl = 0, images = 0, audio = 0;
};
Modalities Count(const packer::Index& ix) {
  Modalities m;
  m.text = ix.text_samples().size();
  m.vl = ix.vl_samples().size();
  for (uint32_t j = 0; j < ix.num_media(); ++j) (ix.media_is_image(j) ? m.images : m.audio)++;
  return m;
}

}  // namespace

const std::vector<Rung>& LadderRungs() {
  static const auto* rungs = [] {
    auto* v = new std::vector<Rung>;
    Rung r;
    r.id = "naive";
    r.name = "naive";
    r.mixed = true;
    r.staged = false;
    r.prefetch = false;
    r.curriculum = false;
    v->push_back(r);
    r.id = "staging";
    r.name = "+ staging, prefetch";
    r.staged = r.prefetch = true;
    v->push_back(r);
    r.id = "segregation";
    r.name = "+ modality segregation";
    r.mixed = false;
    v->push_back(r);
    r.id = "curriculum";
    r.name = "+ max-pixel curriculum";
    r.curriculum = true;
    v->push_back(r);
    r.id = "seed-v1";
    r.name = "+ seed-v1";
    r.strategy = "seed-v1";
    v->push_back(r);
    r.id = "seed-v2";
    r.name = "+ seed-v2";
    r.strategy = "seed-v2";
    v->push_back(r);
    r.id = "post-balancing";
    r.name = "+ post-balancing";
    r.strategy = "sequential";
    r.post_balancing = true;
    v->push_back(r);
    r.id = "tutti";
    r.name = "tutti";
    r.strategy = "tutti";
    r.post_balancing = false;
    v->push_back(r);
    return v;
  }();
  return *rungs;
}

v1::JobConfig RungConfig(const SimSetup& s, const packer::SeedStepShape& shape, uint32_t W,
                         const Rung& rung, uint64_t max_pixels) {
  packer::SeedWorkloadOptions wo = s.workload;
  wo.ranks_per_node = s.cluster.ranks_per_node;
  wo.patch_size = s.model.vision.patch_size;
  wo.merge_size = s.model.vision.merge_size;
  v1::JobConfig c =
      packer::SeedConfig(wo, shape, W, max_pixels, rung.strategy, 6, rung.post_balancing);
  c.set_job_id("simulate");
  c.mutable_post_balancing()->set_hidden_size(s.model.llm.hidden);
  // The packer's constants in proportion to the seconds the time model
  // charges (one LLM token's linear time = 1).
  const ItemTiming& t = s.timing;
  v1::CostModel* cost = c.mutable_cost();
  const double unit = t.llm_linear;
  cost->set_vit_linear(t.vit_linear / unit);
  cost->set_vit_quadratic(t.vit_quadratic / unit);
  cost->set_p_ref(t.vit_linear / t.vit_quadratic);
  cost->set_llm_linear(1);
  cost->set_llm_quadratic(t.llm_quadratic / unit);
  if (t.audio_linear > 0) {
    cost->set_audio_linear(t.audio_linear / unit);
    cost->set_audio_quadratic(t.audio_quadratic / unit);
  }
  return c;
}

absl::Status ValidateSetup(const SimSetup& s, uint32_t W) {
  RETURN_IF_ERROR(ValidateModelShape(s.model));
  RETURN_IF_ERROR(ValidateCluster(s.cluster));
  RETURN_IF_ERROR(ValidateDataPath(s.data));
  const ItemTiming& t = s.timing;
  for (const auto& [name, v] : {std::pair<const char*, double>{"vit_linear", t.vit_linear},
                                {"vit_quadratic", t.vit_quadratic},
                                {"llm_linear", t.llm_linear},
                                {"llm_quadratic", t.llm_quadratic},
                                {"audio_linear", t.audio_linear},
                                {"audio_quadratic", t.audio_quadratic}}) {
    if (!std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("item timing ", name, " is ", v, "; seconds per item are finite and >= 0"));
    }
  }
  if (!(t.vit_linear > 0 && t.vit_quadratic > 0 && t.llm_linear > 0)) {
    return absl::InvalidArgumentError(
        "item timing: the ViT's linear and quadratic terms and the LLM's linear term must be "
        "positive (a calibration needs ViT pairs and LLM pairs)");
  }
  if (W == 0 || W % s.cluster.ranks_per_node != 0) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", W,
                                                   " is not a positive multiple of the cluster's ",
                                                   s.cluster.ranks_per_node, " ranks per node"));
  }
  if (s.syncs.empty()) return absl::InvalidArgumentError("no synchronisation model to simulate");
  for (const SyncModel sync : s.syncs) {
    const double state = StateBytes(s.model, sync, W);
    if (state > s.cluster.hbm_bytes) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "model %s does not fit the cluster's memory: its weights, gradients and optimizer "
          "states take %.1f GB per rank with %s synchronisation at %u ranks, above %s's %.0f GB "
          "per GPU; use --sync fsdp (sharded states), more ranks, or a GPU with more memory",
          s.model.name, state / 1e9, SyncModelName(sync), W, s.cluster.name,
          s.cluster.hbm_bytes / 1e9));
    }
  }
  if (s.index == nullptr) return absl::InvalidArgumentError("no workload index");
  const Modalities m = Count(*s.index);
  if (m.vl == 0 || m.images == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the workload ", s.index->origin(), " has no samples with images (", m.text,
                     " text-only samples): the ladder's encoder phase, the seed strategies and "
                     "post-balancing need them; use a workload with images"));
  }
  if (m.text == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the workload ", s.index->origin(),
                     " has no text-only samples: modality segregation and the text micro-batches "
                     "need them; use a workload with text-only samples"));
  }
  if (s.model.audio.present() && m.audio == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", s.model.name, " has an audio encoder but the workload ", s.index->origin(),
        " has no audio clips; use a workload with audio (--audio-fraction) or a model without"));
  }
  if (!s.model.audio.present() && m.audio > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the workload ", s.index->origin(), " has ", m.audio, " audio clips but model ",
        s.model.name, " has no audio encoder; choose a model with one (vit675m-whisper-dense7b)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<packer::SeedStepShape> LadderShape(const SimSetup& s, uint32_t W) {
  packer::SeedWorkloadOptions wo = s.workload;
  wo.ranks_per_node = s.cluster.ranks_per_node;
  wo.patch_size = s.model.vision.patch_size;
  wo.merge_size = s.model.vision.merge_size;
  auto shape = packer::SeedShape(wo, *s.index, W, s.top_max_pixels);
  if (!shape.ok()) {
    return Annotate(
        shape.status(),
        absl::StrCat("the workload ", s.index->origin(), " at W = ", W,
                     " (give a larger --index or --samples, or smaller --world-sizes)"));
  }
  return shape;
}

namespace {

// One synchronisation model's sums over the steps of a rung.
struct Tally {
  explicit Tally(const DataPipeline& p) : pipeline(p) {}
  DataPipeline pipeline;
  RungResult r;
  double sum_step = 0, sum_ideal = 0, sum_text = 0, sum_bound = 0, tokens = 0;
  std::array<double, kPhaseKinds> sum_mean{}, sum_max{};
  std::vector<double> spread;
};

}  // namespace

absl::StatusOr<std::vector<RungResult>> RunRung(const SimSetup& s,
                                                const packer::SeedStepShape& shape, uint32_t W,
                                                const Rung& rung, uint64_t stage_max_pixels) {
  const uint64_t max_pixels = rung.curriculum ? stage_max_pixels : s.top_max_pixels;
  v1::JobConfig config = RungConfig(s, shape, W, rung, max_pixels);
  auto job = packer::Job::Create(config, s.index);
  if (!job.ok()) {
    // The batch is not the user's to set here: say how it was sized.
    return Annotate(
        job.status(),
        absl::StrCat("rung '", rung.name, "' at W = ", W, " (the ladder's batch fills ",
                     shape.text_seqs + shape.vl_seqs, " sequences of ", s.workload.seq_len,
                     " tokens per rank: ", shape.text_samples, " text-only and ", shape.vl_samples,
                     " VL samples a step; a workload needs two steps' worth: give a larger "
                     "--index or --samples, or smaller --world-sizes)"));
  }
  const packer::Planner planner(*job);
  DataPathOptions data = s.data;
  data.staged = rung.staged;
  if (!rung.prefetch) {
    data.prefetch_window = 0;
    data.deadline_seconds = 0;
  }
  WorkOptions wo;
  wo.model = &s.model;
  wo.cluster = &s.cluster;
  wo.timing = s.timing;
  wo.attention = s.attention;
  std::vector<Tally> tallies;
  for (const SyncModel sync : s.syncs) {
    Tally& t =
        tallies.emplace_back(DataPipeline(data, W / s.cluster.ranks_per_node, config.seed()));
    t.r.rung = rung.name;
    t.r.sync = sync;
    t.r.world_size = W;
    t.r.max_pixels = max_pixels;
    t.r.state_bytes = StateBytes(s.model, sync, W);
  }
  packer::StepPlanData d;
  for (uint64_t step = s.from; step < s.from + s.steps; ++step) {
    absl::Status st = rung.mixed ? planner.Draw(step, &d) : planner.Plan(step, &d);
    if (!st.ok()) return Annotate(st, absl::StrCat("rung '", rung.name, "'"));
    const StepWork work = rung.mixed ? NaiveWork(**job, d, wo) : PlannedWork(**job, d, wo);
    for (size_t i = 0; i < tallies.size(); ++i) {
      Tally& y = tallies[i];
      RungResult& r = y.r;
      StepTime t = EvaluateStep(work, s.syncs[i]);
      t.stall = y.pipeline.Step(step, work.node_items, t.compute);
      t.step = t.stall + t.compute;
      y.sum_step += t.step;
      y.sum_ideal += t.ideal;
      y.sum_text += t.text_only;
      y.sum_bound += t.bound;
      y.tokens += static_cast<double>(work.llm_tokens);
      r.exchange_seconds += t.exchange;
      r.stall_seconds += t.stall;
      r.inter_node_bytes += static_cast<double>(work.inter_node_bytes);
      r.peak_activation_bytes = std::max(r.peak_activation_bytes, t.peak_activation_bytes);
      for (int k = 0; k < kPhaseKinds; ++k) y.sum_mean[k] += t.mean[k], y.sum_max[k] += t.max[k];
      for (double x : t.rank_compute) y.spread.push_back(t.ideal > 0 ? x / t.ideal : 1);
      ++r.steps;
    }
  }
  std::vector<RungResult> out;
  for (Tally& y : tallies) {
    RungResult& r = y.r;
    const double n = static_cast<double>(std::max<uint64_t>(1, r.steps));
    r.step_seconds = y.sum_step / n;
    r.tokens_per_second = y.sum_step > 0 ? y.tokens / y.sum_step : 0;
    r.tokens_per_second_per_gpu = r.tokens_per_second / W;
    r.exchange_seconds /= n;
    r.stall_seconds /= n;
    r.inter_node_bytes /= n;
    for (int k = 0; k < kPhaseKinds; ++k) {
      r.idle_share[k] = k != kExchange && y.sum_max[k] > 0 ? 1 - y.sum_mean[k] / y.sum_max[k] : 0;
    }
    r.efficiency_ideal = y.sum_step > 0 ? y.sum_ideal / y.sum_step : 0;
    r.efficiency_text_only = y.sum_step > 0 ? y.sum_text / y.sum_step : 0;
    r.efficiency_bound = y.sum_bound > 0 ? y.sum_ideal / y.sum_bound : 0;
    r.fits_memory = r.state_bytes + r.peak_activation_bytes <= s.cluster.hbm_bytes;
    const double qs[7] = {0, 0.05, 0.25, 0.5, 0.75, 0.95, 1};
    for (int i = 0; i < 7; ++i) r.spread[i] = QuantileOf(y.spread, qs[i]);
    out.push_back(std::move(r));
  }
  return out;
}

absl::StatusOr<std::vector<RungResult>> RunLadder(const SimSetup& s, uint32_t W,
                                                  uint64_t stage_max_pixels,
                                                  const std::vector<std::string>& only) {
  for (const std::string& id : only) {
    const auto& rungs = LadderRungs();
    if (std::none_of(rungs.begin(), rungs.end(), [&](const Rung& r) { return r.id == id; })) {
      std::vector<std::string> ids;
      for (const Rung& r : rungs) ids.push_back(r.id);
      return absl::InvalidArgumentError(
          absl::StrCat("rung '", id, "' is unknown; choose from: ", absl::StrJoin(ids, ", ")));
    }
  }
  RETURN_IF_ERROR(ValidateSetup(s, W));
  ASSIGN_OR_RETURN(packer::SeedStepShape shape, LadderShape(s, W));
  std::vector<RungResult> out;
  for (const Rung& rung : LadderRungs()) {
    if (!only.empty() && std::find(only.begin(), only.end(), rung.id) == only.end()) continue;
    ASSIGN_OR_RETURN(std::vector<RungResult> r, RunRung(s, shape, W, rung, stage_max_pixels));
    for (RungResult& x : r) out.push_back(std::move(x));
  }
  return out;
}

}  // namespace tutti::sim
