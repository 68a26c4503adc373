// The online cost-model fit (job.proto CostFitConfig): ranks report each
// step's phase times; each report is paired with what its rank held in that
// step's plan (RankFeatures) and kept, per phase, in a window of the newest
// reports; every interval_steps a robust fit per phase (cost_fit.h) gives
// new constants, and when they differ enough from those in force they are
// announced to a CostSchedule (cost_schedule.h), lead_steps ahead.
//
// Units: the new constants keep the LLM's linear constant as it is and put
// every other constant on that scale (seconds per LLM token of linear work
// become one unit), so every phase keeps its weight against the others as
// measured. A phase whose fit is refused keeps its constants; without an
// LLM fit a phase keeps its linear constant and takes the fitted ratio of
// its quadratic to linear term.
//
// Not thread-safe: the caller serialises Add and Fit.
#ifndef TUTTI_SERVICES_PACKER_CORE_ONLINE_FIT_H_
#define TUTTI_SERVICES_PACKER_CORE_ONLINE_FIT_H_

#include <array>
#include <cstdint>
#include <deque>
#include <string>

#include "absl/status/status.h"
#include "common/cost_model.h"
#include "services/packer/core/cost_fit.h"
#include "services/packer/core/plan_data.h"
#include "tutti/v1/job.pb.h"

namespace tutti::packer {

enum FitPhaseId { kFitVit = 0, kFitAudio = 1, kFitLlm = 2, kFitPhases = 3 };
const char* FitPhaseName(int phase);  // "vit", "audio", "llm"

// CostFitConfig with its defaults (job.proto).
struct OnlineFitOptions {
  bool enabled = false;
  uint32_t interval_steps = 50;
  uint32_t min_reports = 128;
  uint32_t window_reports = 16384;
  uint32_t lead_steps = 16;  // 2 x plan_window
  double min_change = 0.02;
  FitOptions fit;  // the robust fit's own (min_samples comes from min_reports)
};
OnlineFitOptions OnlineFitOptionsFrom(const v1::JobConfig& config);

// What a rank held in a step, per phase: sum of x and of x^2 over its
// images (patches), audio clips (tokens) and documents (LLM tokens).
struct RankFeatures {
  std::array<double, kFitPhases> sum{}, sum_sq{};
};
RankFeatures FeaturesOf(const StepPlanData& plan, uint32_t rank);

struct FitRound {
  bool announce = false;
  CostModelOptions cost;  // the fitted constants (those in force where nothing fitted)
  double change = 0;      // largest relative change of a probe cost (see Fit)
  std::array<absl::Status, kFitPhases> phase;  // each phase's fit, or why it was refused
  std::array<PhaseFit, kFitPhases> fits;
};

class OnlineCostFit {
 public:
  explicit OnlineCostFit(OnlineFitOptions options);

  // One rank's report of `step`: seconds[p] < 0 where phase p was not
  // reported. Times and features must be finite and >= 0 (the caller
  // refuses reports that are not).
  void Add(uint64_t step, const RankFeatures& features,
           const std::array<double, kFitPhases>& seconds);
  // True once reports reach interval_steps past the last fit (or the first
  // report).
  bool Due() const;
  // Fits every phase and compares with `current`: announce is set when some
  // probe cost (a typical and a large item of each phase, relative to a
  // typical LLM document) moves by more than min_change. Starts the next
  // interval.
  FitRound Fit(const CostModelOptions& current);

  uint64_t newest_step() const { return newest_; }
  size_t reports(int phase) const { return window_[phase].size(); }
  const OnlineFitOptions& options() const { return o_; }

 private:
  OnlineFitOptions o_;
  std::array<std::deque<FitSample>, kFitPhases> window_;
  bool any_ = false;
  uint64_t newest_ = 0;
  uint64_t last_fit_ = 0;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_ONLINE_FIT_H_
