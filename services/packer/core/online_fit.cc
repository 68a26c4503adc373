#include "services/packer/core/online_fit.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tutti::packer {
namespace {

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}

double& Linear(CostModelOptions& c, int p) {
  return p == kFitVit ? c.vit_linear : p == kFitAudio ? c.audio_linear : c.llm_linear;
}
double& Quadratic(CostModelOptions& c, int p) {
  return p == kFitVit ? c.vit_quadratic : p == kFitAudio ? c.audio_quadratic : c.llm_quadratic;
}
double Cost(CostModelOptions c, int p, double x) {
  return x * (Linear(c, p) + Quadratic(c, p) * x);
}

}  // namespace

const char* FitPhaseName(int phase) {
  return phase == kFitVit ? "vit" : phase == kFitAudio ? "audio" : "llm";
}

OnlineFitOptions OnlineFitOptionsFrom(const v1::JobConfig& config) {
  OnlineFitOptions o;
  const v1::CostFitConfig& f = config.cost().online_fit();
  o.enabled = f.enabled();
  if (f.interval_steps()) o.interval_steps = f.interval_steps();
  if (f.min_reports()) o.min_reports = f.min_reports();
  if (f.window_reports()) o.window_reports = f.window_reports();
  o.lead_steps = f.lead_steps() ? f.lead_steps() : 2 * std::max<uint32_t>(1, config.plan_window());
  if (f.min_change() > 0) o.min_change = f.min_change();
  o.window_reports = std::max(o.window_reports, o.min_reports);
  return o;
}

RankFeatures FeaturesOf(const StepPlanData& d, uint32_t r) {
  RankFeatures f;
  if (r < d.enc_images.rows()) {
    for (const uint32_t *i = d.enc_images.row(r), *e = i + d.enc_images.size(r); i < e; ++i) {
      const double p = d.images[*i].patches;
      f.sum[kFitVit] += p;
      f.sum_sq[kFitVit] += p * p;
    }
  }
  if (r < d.enc_audio.rows()) {
    for (const uint32_t *i = d.enc_audio.row(r), *e = i + d.enc_audio.size(r); i < e; ++i) {
      const double t = d.audio[*i].tokens;
      f.sum[kFitAudio] += t;
      f.sum_sq[kFitAudio] += t * t;
    }
  }
  const uint32_t S = d.seqs_per_rank();
  for (uint32_t q = 0; q < S && size_t{r} * S + q < d.docs.rows(); ++q) {
    const uint32_t row = r * S + q;
    for (const uint32_t *k = d.docs.row(row), *e = k + d.docs.size(row); k < e; ++k) {
      const double n = d.samples[*k].cost.llm_tokens;
      f.sum[kFitLlm] += n;
      f.sum_sq[kFitLlm] += n * n;
    }
  }
  return f;
}

OnlineCostFit::OnlineCostFit(OnlineFitOptions options) : o_(std::move(options)) {
  o_.fit.min_samples = o_.min_reports;
}

void OnlineCostFit::Add(uint64_t step, const RankFeatures& f,
                        const std::array<double, kFitPhases>& seconds) {
  if (!any_) last_fit_ = step;
  any_ = true;
  newest_ = std::max(newest_, step);
  for (int p = 0; p < kFitPhases; ++p) {
    if (seconds[p] < 0) continue;
    std::deque<FitSample>& w = window_[p];
    w.push_back(FitSample{f.sum[p], f.sum_sq[p], seconds[p]});
    while (w.size() > o_.window_reports) w.pop_front();
  }
}

bool OnlineCostFit::Due() const { return any_ && newest_ >= last_fit_ + o_.interval_steps; }

FitRound OnlineCostFit::Fit(const CostModelOptions& current) {
  last_fit_ = newest_;
  FitRound round;
  round.cost = current;
  for (int p = 0; p < kFitPhases; ++p) {
    const std::vector<FitSample> samples(window_[p].begin(), window_[p].end());
    absl::StatusOr<PhaseFit> fit = FitPhase(samples, o_.fit);
    if (fit.ok() && fit->linear <= 0 && fit->quadratic <= 0) {
      fit = absl::FailedPreconditionError("the fit gives the items no cost");
    }
    round.phase[p] = fit.status();
    if (fit.ok()) round.fits[p] = *fit;
  }
  // One scale for every phase: the LLM's linear constant stays.
  const bool llm = round.phase[kFitLlm].ok() && round.fits[kFitLlm].linear > 0;
  const double scale = llm ? current.llm_linear / round.fits[kFitLlm].linear : 0;
  for (int p = 0; p < kFitPhases; ++p) {
    if (!round.phase[p].ok()) continue;
    const PhaseFit& f = round.fits[p];
    if (llm) {
      Linear(round.cost, p) = f.linear * scale;
      Quadratic(round.cost, p) = f.quadratic * scale;
    } else if (f.linear > 0) {
      Quadratic(round.cost, p) = Linear(round.cost, p) * f.quadratic / f.linear;
    } else {
      round.phase[p] = absl::FailedPreconditionError(
          "no LLM fit to set its scale and no linear term to keep: kept as it was");
    }
  }
  // Probe costs: a typical and a large item of each phase (the reports'
  // size-weighted mean item, median and 95th percentile), relative to a
  // typical LLM document.
  std::vector<double> before, after;
  size_t ref = 0;  // the typical LLM document's probe when the LLM reported
  for (int p = 0; p < kFitPhases; ++p) {
    std::vector<double> sizes;
    for (const FitSample& s : window_[p]) {
      if (s.linear > 0) sizes.push_back(s.quadratic / s.linear);
    }
    if (sizes.empty()) continue;
    if (p == kFitLlm) ref = before.size();
    for (const double q : {0.5, 0.95}) {
      const double x = Quantile(sizes, q);
      before.push_back(Cost(current, p, x));
      after.push_back(Cost(round.cost, p, x));
    }
  }
  if (!before.empty() && before[ref] > 0 && after[ref] > 0) {
    for (size_t i = 0; i < before.size(); ++i) {
      if (before[i] <= 0) continue;
      const double moved = (after[i] / after[ref]) / (before[i] / before[ref]);
      round.change = std::max(round.change, std::abs(moved - 1));
    }
  }
  round.announce = round.change > o_.min_change;
  return round;
}

}  // namespace tutti::packer
