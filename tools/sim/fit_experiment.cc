#include "tools/sim/fit_experiment.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/status.h"
#include "services/packer/core/job.h"
#include "services/packer/core/online_fit.h"
#include "services/packer/core/planner.h"
#include "tools/sim/step_work.h"

namespace tutti::sim {
namespace {

struct Ratios {
  double vit = 1, llm = 1, compute = 1;
};

// The true time model's max/mean per phase and of the ranks' compute.
Ratios Measure(const StepTime& t) {
  Ratios r;
  r.vit = t.mean[kVit] > 0 ? t.max[kVit] / t.mean[kVit] : 1;
  r.llm = t.mean[kLlm] > 0 ? t.max[kLlm] / t.mean[kLlm] : 1;
  const double top = *std::max_element(t.rank_compute.begin(), t.rank_compute.end());
  r.compute = t.ideal > 0 ? top / t.ideal : 1;
  return r;
}

void Push(const Ratios& r, FitExperimentResult::Series* s) {
  s->vit.push_back(r.vit);
  s->llm.push_back(r.llm);
  s->compute.push_back(r.compute);
}

FitExperimentResult::Summary Average(const FitExperimentResult::Series& s, size_t begin,
                                     size_t end) {
  FitExperimentResult::Summary m;
  end = std::min(end, s.vit.size());
  if (begin >= end) return m;
  for (size_t i = begin; i < end; ++i)
    m.vit += s.vit[i], m.llm += s.llm[i], m.compute += s.compute[i];
  const double n = static_cast<double>(end - begin);
  m.vit /= n, m.llm /= n, m.compute /= n;
  return m;
}

}  // namespace

absl::StatusOr<FitExperimentResult> RunFitExperiment(const SimSetup& s,
                                                     const FitExperimentOptions& o) {
  if (!(o.off_by > 0) || o.steps == 0 || o.window == 0) {
    return absl::InvalidArgumentError(
        "the fit experiment needs --off-by > 0, --steps >= 1 and a window >= 1");
  }
  RETURN_IF_ERROR(ValidateSetup(s, o.world_size));
  ASSIGN_OR_RETURN(packer::SeedStepShape shape, LadderShape(s, o.world_size));
  Rung rung;
  rung.name = "fit";
  rung.strategy = o.strategy;
  rung.post_balancing = o.post_balancing;
  const v1::JobConfig truth_config = RungConfig(s, shape, o.world_size, rung, o.max_pixels);
  v1::JobConfig config = truth_config;
  v1::CostModel* c = config.mutable_cost();
  c->set_vit_quadratic(c->vit_quadratic() * o.off_by);
  c->set_p_ref(c->vit_linear() / c->vit_quadratic());
  c->set_llm_quadratic(c->llm_quadratic() * o.off_by);
  c->set_audio_quadratic(c->audio_quadratic() * o.off_by);
  v1::CostFitConfig* f = c->mutable_online_fit();
  f->set_enabled(true);
  f->set_interval_steps(o.interval_steps);
  f->set_min_reports(o.min_reports);
  ASSIGN_OR_RETURN(auto job, packer::Job::Create(config, s.index));
  ASSIGN_OR_RETURN(auto truth_job, packer::Job::Create(truth_config, s.index));
  packer::CostSchedule schedule;
  const packer::Planner fitted(job, nullptr, &schedule), configured(job), truth(truth_job);
  packer::OnlineCostFit fit(packer::OnlineFitOptionsFrom(config));
  WorkOptions wo;
  wo.model = &s.model;
  wo.cluster = &s.cluster;
  wo.timing = s.timing;
  wo.attention = s.attention;
  const SyncModel sync = s.syncs.empty() ? SyncModel::kAllReduce : s.syncs.front();
  Rng rng(MixSeed(config.seed(), 0x66697421));
  FitExperimentResult out;
  packer::StepPlanData d;
  for (uint64_t step = s.from; step < s.from + o.steps; ++step) {
    RETURN_IF_ERROR(fitted.Plan(step, &d));
    const StepWork work = PlannedWork(*job, d, wo);
    const StepTime t = EvaluateStep(work, sync);
    Push(Measure(t), &out.fit);
    // What each rank reports: its phases' true seconds, noisy, some stalled.
    std::vector<double> vit(d.world_size, 0.0), llm(d.world_size, 0.0), audio(d.world_size, 0.0);
    for (const Segment& seg : work.segments) {
      std::vector<double>* into = seg.kind == kVit     ? &vit
                                  : seg.kind == kLlm   ? &llm
                                  : seg.kind == kAudio ? &audio
                                                       : nullptr;
      if (into == nullptr) continue;
      for (uint32_t r = 0; r < d.world_size; ++r) (*into)[r] += seg.seconds[r];
    }
    for (uint32_t r = 0; r < d.world_size; ++r) {
      std::array<double, packer::kFitPhases> sec;
      sec[packer::kFitVit] = vit[r];
      sec[packer::kFitLlm] = llm[r];
      sec[packer::kFitAudio] = d.audio.empty() ? -1 : audio[r];
      for (double& x : sec) {
        if (x < 0) continue;
        x = std::max(0.0, x * (1 + o.noise * rng.Normal()));
        if (rng.Bernoulli(o.stalled_share)) x *= rng.Uniform(3, 10);
      }
      fit.Add(step, packer::FeaturesOf(d, r), sec);
    }
    if (fit.Due()) {
      const std::optional<packer::CostFitEntry> latest = schedule.latest();
      const CostModelOptions current = latest ? latest->cost : CostOptions(config);
      const packer::FitRound round = fit.Fit(current);
      ++out.rounds;
      bool any = false;
      for (const absl::Status& p : round.phase) any |= p.ok();
      out.refused += !any;
      if (any && round.announce) {
        ASSIGN_OR_RETURN(packer::CostFitEntry e,
                         schedule.Announce(round.cost, step + fit.options().lead_steps));
        out.fits.push_back(e);
      }
    }
    RETURN_IF_ERROR(configured.Plan(step, &d));
    Push(Measure(EvaluateStep(PlannedWork(*job, d, wo), sync)), &out.configured);
    RETURN_IF_ERROR(truth.Plan(step, &d));
    Push(Measure(EvaluateStep(PlannedWork(*truth_job, d, wo), sync)), &out.truth);
  }
  const size_t n = out.fit.vit.size(), w = std::min<size_t>(o.window, n);
  out.before = Average(out.fit, 0, w);
  out.after = Average(out.fit, n - w, n);
  out.configured_after = Average(out.configured, n - w, n);
  out.truth_after = Average(out.truth, n - w, n);
  return out;
}

}  // namespace tutti::sim
