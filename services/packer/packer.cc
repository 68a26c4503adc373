#include "services/packer/packer.h"

#include <google/protobuf/arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "services/packer/plan_proto.h"

namespace tutti::packer {
namespace {

constexpr double kFitWeight = 0.1;  // weight of a new report in the moving average

ServedPlansOptions WithWindow(ServedPlansOptions o, const Job& job) {
  o.keep_behind = std::max(o.keep_behind, job.config().plan_window());
  return o;
}

}  // namespace

Packer::Packer(std::shared_ptr<const Job> job, PlanWindow* window, PackerMetrics* metrics,
               ServedPlansOptions served)
    : job_(std::move(job)), window_(window), metrics_(metrics), served_(WithWindow(served, *job_)) {
  BuildJobInfo(*job_, &job_info_);
  if (served_.options().precompute != kPrecomputeNone && served_.options().max_bytes > 0) {
    window_->SetOnPlanned(
        [this](uint64_t step, const PlanPtr& plan) { Precompute(step, *plan); });
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
  // Seconds per unit of planned cost, when the step's plan is at hand. Only
  // exposed (metrics); plans never change, so served plans stay identical.
  PlanPtr plan = window_->Peek(t.step);
  if (plan == nullptr || t.rank >= plan->ranks.size()) return absl::OkStatus();
  const RankTotals& cost = plan->ranks[t.rank];
  absl::MutexLock lock(&mu_);
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

void Packer::CountServed(bool stream, const absl::Status& status) {
  if (metrics_ == nullptr) return;
  if (status.ok()) {
    (stream ? metrics_->served_stream : metrics_->served_get).Increment();
  } else {
    metrics_->CountError(static_cast<int>(status.code()));
  }
}

}  // namespace tutti::packer
