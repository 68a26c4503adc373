#include "services/packer/packer.h"

#include <google/protobuf/arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job_config.h"
#include "common/log.h"
#include "services/packer/plan_proto.h"

namespace tutti::packer {
namespace {

const Logger kLog("packer");

constexpr double kFitWeight = 0.1;  // weight of a new report in the moving average

ServedPlansOptions WithWindow(ServedPlansOptions o, const Job& job) {
  o.keep_behind = std::max(o.keep_behind, job.config().plan_window());
  return o;
}

}  // namespace

Packer::Packer(std::shared_ptr<const Job> job, PlanWindow* window, PackerMetrics* metrics,
               ServedPlansOptions served, CostSchedule* costs)
    : job_(std::move(job)),
      window_(window),
      metrics_(metrics),
      served_(WithWindow(served, *job_)),
      costs_(costs) {
  BuildJobInfo(*job_, &job_info_);
  const OnlineFitOptions fit = OnlineFitOptionsFrom(job_->config());
  if (fit.enabled && costs_ != nullptr) {
    absl::MutexLock lock(&mu_);
    fit_ = std::make_unique<OnlineCostFit>(fit);
  }
  if (served_.options().precompute != kPrecomputeNone && served_.options().max_bytes > 0) {
    window_->SetOnPlanned([this](uint64_t step, const PlanPtr& plan) { Precompute(step, *plan); });
  }
}

Packer::~Packer() {
  stopping_.store(true, std::memory_order_relaxed);
  if (served_.options().precompute != kPrecomputeNone) window_->SetOnPlanned(nullptr);
}

absl::Status Packer::CheckClient(const ClientView& c) const {
  const uint32_t W = job_->world_size();
  if (c.world_size != 0 && c.world_size != W) {
    return absl::FailedPreconditionError(
        absl::StrCat("world_size ", c.world_size, " does not match the job's world_size ", W,
                     ": tutti-packerd plans for ", W, " ranks; start the job with ", W,
                     " ranks, or restart tutti-packerd with a config whose world_size is ",
                     c.world_size, " (the global batches stay the same)"));
  }
  if (!c.config_fingerprint.empty() && c.config_fingerprint != job_->fingerprint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "config fingerprint ", c.config_fingerprint, " does not match the packer's ",
        job_->fingerprint(),
        ": the client and tutti-packerd use different job configs; give both the same config "
        "(GetJob returns the packer's)"));
  }
  return CheckRanks(*job_, c.ranks);
}

void Packer::GetPlan(uint64_t step, const ClientView& client, v1::StepPlan* plan,
                     std::function<void(absl::Status)> done) {
  if (absl::Status s = CheckClient(client); !s.ok()) return done(s);
  if (absl::Status s = job_->CheckStep(step); !s.ok()) return done(s);
  window_->Get(step, [this, client, plan, done = std::move(done)](absl::StatusOr<PlanPtr> r) {
    if (!r.ok()) return done(r.status());
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s = BuildStepPlan(*job_, **r, client.ranks, plan);
    plan->mutable_stats()->set_plan_seconds((*r)->plan_seconds);
    if (metrics_) {
      metrics_->plan_build_seconds.Observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    done(s);
  });
}

void Packer::GetPlanBytes(uint64_t step, const ClientView& client,
                          std::function<void(absl::StatusOr<PlanBytes>)> done) {
  if (absl::Status s = CheckClient(client); !s.ok()) return done(s);
  if (absl::Status s = job_->CheckStep(step); !s.ok()) return done(s);
  std::vector<uint32_t> key = ServedPlans::Key(client.ranks);
  bool build = false;
  if (PlanBytes kept = served_.Serve(step, key, &done, &build)) {
    if (metrics_) metrics_->served_cache_hits.Increment();
    return done(std::move(kept));
  }
  // `done` waits for the build of these bytes: this one, or one under way.
  if (!build) {
    if (metrics_) metrics_->served_cache_joined.Increment();
    return;
  }
  if (metrics_) metrics_->served_cache_misses.Increment();
  window_->Get(step, [this, step, key = std::move(key)](absl::StatusOr<PlanPtr> r) {
    ServedPlans::Completed done =
        served_.Complete(step, key, r.ok() ? Build(step, **r, key) : r.status(),
                         /*precomputed=*/false);
    if (metrics_) metrics_->served_cache_bytes.Set(static_cast<double>(served_.bytes()));
    done.Run();
  });
}

absl::StatusOr<Packer::PlanBytes> Packer::Build(uint64_t step, const StepPlanData& data,
                                                const std::vector<uint32_t>& key) {
  const auto t0 = std::chrono::steady_clock::now();
  // Its hundreds of small messages on an arena: freed at once.
  google::protobuf::Arena arena;
  auto* plan = google::protobuf::Arena::CreateMessage<v1::StepPlan>(&arena);
  if (absl::Status s = BuildStepPlan(*job_, data, key, plan); !s.ok()) return s;
  plan->mutable_stats()->set_plan_seconds(data.plan_seconds);
  auto bytes = std::make_shared<std::string>();
  if (!plan->SerializeToString(bytes.get())) {
    return absl::InternalError(absl::StrCat("the plan of step ", step, " (", plan->ByteSizeLong(),
                                            " bytes) cannot be serialized"));
  }
  if (metrics_) {
    metrics_->plan_build_seconds.Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return PlanBytes(std::move(bytes));
}

uint64_t Packer::Precompute(uint64_t step, const StepPlanData& data) {
  const uint32_t shapes = served_.options().precompute;
  const uint32_t W = job_->world_size();
  const uint32_t rpn = std::clamp<uint32_t>(job_->ranks_per_node(), 1, std::max<uint32_t>(W, 1));
  std::vector<std::vector<uint32_t>> keys;
  if (shapes & kPrecomputeNodes) {
    for (uint32_t first = 0; first < W; first += rpn) {
      std::vector<uint32_t>& k = keys.emplace_back();
      for (uint32_t r = first; r < std::min(W, first + rpn); ++r) k.push_back(r);
    }
  }
  if ((shapes & kPrecomputeRanks) && !((shapes & kPrecomputeNodes) && rpn == 1)) {
    for (uint32_t r = 0; r < W; ++r) keys.push_back({r});
  }
  uint64_t built = 0;
  for (const std::vector<uint32_t>& key : keys) {
    if (stopping_.load(std::memory_order_relaxed) || window_->stopping()) break;
    const ServedPlans::Claim claim = served_.ClaimPrecompute(step, key);
    if (claim == ServedPlans::Claim::kFull) break;
    if (claim == ServedPlans::Claim::kSkip) continue;
    served_.Complete(step, key, Build(step, data, key), /*precomputed=*/true).Run();
    ++built;
  }
  if (metrics_ && built > 0) {
    metrics_->served_precomputed.Increment(static_cast<double>(built));
    metrics_->served_cache_bytes.Set(static_cast<double>(served_.bytes()));
  }
  return built;
}

absl::StatusOr<uint64_t> Packer::StreamEnd(uint64_t start, uint64_t end) const {
  if (absl::Status s = job_->CheckStep(start); !s.ok()) return s;
  if (end != 0 && end <= start) {
    return absl::InvalidArgumentError(
        absl::StrCat("end_step ", end, " is not after start_step ", start,
                     "; ask for end_step > start_step, or 0 to stream until the dataset ends"));
  }
  const uint64_t total = job_->total_steps();
  if (end == 0) return total > 0 ? total : UINT64_MAX;
  return total > 0 ? std::min(end, total) : end;
}

absl::Status Packer::ReportTiming(const StepTiming& t) {
  absl::Status status;
  if (t.rank >= job_->world_size()) {
    status = absl::InvalidArgumentError(
        absl::StrCat("timing report for rank ", t.rank, ", which is outside the world (world_size ",
                     job_->world_size(), "); report from ranks 0..", job_->world_size() - 1));
  } else if (absl::Status s = job_->CheckStep(t.step); !s.ok()) {
    status =
        absl::OutOfRangeError(absl::StrCat("timing report for step ", t.step, ": ", s.message()));
  } else if (!t.config_fingerprint.empty() && t.config_fingerprint != job_->fingerprint()) {
    status = absl::FailedPreconditionError(absl::StrCat(
        "timing report for step ", t.step, " rank ", t.rank, ": config_fingerprint ",
        t.config_fingerprint, " is not this job's (", job_->fingerprint(),
        "): the report comes from a client of another job and is not used; point it at its own "
        "packer"));
  } else {
    for (const auto& [phase, seconds] : t.phases) {
      if (phase.empty() || phase.size() > 64 || !std::isfinite(seconds) || seconds < 0 ||
          seconds > 1e6) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "timing report for step ", t.step, " rank ", t.rank, ": phase '", phase, "' with ",
            seconds, " seconds is not valid; send a named phase with 0 <= seconds <= 1e6"));
        break;
      }
    }
  }
  if (!status.ok()) {
    if (metrics_) metrics_->timing_rejected.Increment();
    return status;
  }
  if (metrics_) {
    metrics_->timing_accepted.Increment();
    for (const auto& [phase, seconds] : t.phases) metrics_->ReportedPhase(phase).Observe(seconds);
  }
  // Seconds per unit of planned cost, when the step's plan is at hand
  // (metrics), and the online fit's report.
  PlanPtr plan = window_->Peek(t.step);
  if (plan == nullptr || t.rank >= plan->ranks.size()) return absl::OkStatus();
  const RankTotals& cost = plan->ranks[t.rank];
  absl::MutexLock lock(&mu_);
  if (fit_ != nullptr) {
    std::array<double, kFitPhases> seconds;
    seconds.fill(-1);
    for (const auto& [phase, s] : t.phases) {
      for (int p = 0; p < kFitPhases; ++p) {
        if (phase == FitPhaseName(p)) seconds[p] = s;
      }
    }
    fit_->Add(t.step, FeaturesOf(*plan, t.rank), seconds);
    if (fit_->Due()) RunFitRound();
  }
  for (const auto& [phase, seconds] : t.phases) {
    double* fit = phase == "vit" ? &fitted_vit_ : phase == "llm" ? &fitted_llm_ : nullptr;
    const double units = phase == "vit" ? cost.vit : cost.llm;
    if (fit == nullptr || units <= 0) continue;
    const double x = seconds / units;
    *fit = *fit == 0 ? x : (1 - kFitWeight) * *fit + kFitWeight * x;
    if (metrics_) (phase == "vit" ? metrics_->fitted_vit : metrics_->fitted_llm).Set(*fit);
  }
  return absl::OkStatus();
}

void Packer::RunFitRound() {
  const std::optional<CostFitEntry> latest = costs_->latest();
  const CostModelOptions current = latest ? latest->cost : CostOptions(job_->config());
  const FitRound round = fit_->Fit(current);
  std::string phases;
  bool any = false;
  for (int p = 0; p < kFitPhases; ++p) {
    if (fit_->reports(p) == 0) continue;
    any |= round.phase[p].ok();
    absl::StrAppend(&phases, phases.empty() ? "" : "; ", FitPhaseName(p), ": ",
                    round.phase[p].ok()
                        ? absl::StrFormat("%.4g + %.4g x + %.4g x^2 s (%u reports, %u outliers)",
                                          round.fits[p].intercept, round.fits[p].linear,
                                          round.fits[p].quadratic, round.fits[p].samples,
                                          round.fits[p].outliers)
                        : std::string(round.phase[p].message()));
  }
  if (!any) {
    if (metrics_) metrics_->cost_fits_refused.Increment();
    kLog.Warning(absl::StrCat("online cost fit after step ", fit_->newest_step(),
                              ": no phase could be fitted, constants kept (", phases, ")"));
    return;
  }
  if (!round.announce) {
    if (metrics_) metrics_->cost_fits_unchanged.Increment();
    kLog.Info(
        absl::StrFormat("online cost fit after step %u: within %.1f%% of the constants in "
                        "force, kept (%s)",
                        fit_->newest_step(), 100 * round.change, phases));
    return;
  }
  absl::StatusOr<CostFitEntry> e =
      costs_->Announce(round.cost, fit_->newest_step() + fit_->options().lead_steps);
  if (!e.ok()) {
    if (metrics_) metrics_->cost_fits_refused.Increment();
    kLog.Warning(absl::StrCat("online cost fit after step ", fit_->newest_step(),
                              " not announced: ", e.status().message()));
    return;
  }
  const CostModelOptions& c = e->cost;
  kLog.Info(absl::StrFormat(
      "online cost fit %u from step %u (announced after step %u; relative costs moved by "
      "%.1f%%): vit %.6g + %.6g p^2, audio %.6g + %.6g t^2, llm %.6g + %.6g n^2 (%s)",
      e->id, e->from_step, fit_->newest_step(), 100 * round.change, c.vit_linear, c.vit_quadratic,
      c.audio_linear, c.audio_quadratic, c.llm_linear, c.llm_quadratic, phases));
  if (metrics_) {
    metrics_->cost_fits_announced.Increment();
    metrics_->cost_fit_from_step.Set(static_cast<double>(e->from_step));
    const struct {
      const char* phase;
      const char* term;
      double value;
    } constants[] = {{"vit", "linear", c.vit_linear},     {"vit", "quadratic", c.vit_quadratic},
                     {"audio", "linear", c.audio_linear}, {"audio", "quadratic", c.audio_quadratic},
                     {"llm", "linear", c.llm_linear},     {"llm", "quadratic", c.llm_quadratic}};
    for (const auto& k : constants) {
      metrics_->cost_fit_constant.Add({{"phase", k.phase}, {"term", k.term}}).Set(k.value);
    }
  }
}

void Packer::CountServed(bool stream, const absl::Status& status) {
  if (metrics_ == nullptr) return;
  if (status.ok()) {
    (stream ? metrics_->served_stream : metrics_->served_get).Increment();
  } else {
    metrics_->CountError(static_cast<int>(status.code()));
  }
}

}  // namespace tutti::packer
