// The online cost fit's effect, measured in the simulator: a job whose
// configured cost constants are off from the true ones (the quadratic terms
// `off_by` times what the time model charges: an attention cost assumed for
// an eager ViT on a fused kernel) is planned step by step with the
// packer's online fit (online_fit.h, cost_schedule.h) fed with what its
// ranks would report: the time model's per-rank phase times with noise and
// some stalled ranks. Beside it the same steps planned with the configured
// constants throughout and with the true ones. Per step, each phase's
// slowest rank over the mean rank, in true seconds.
#ifndef TUTTI_TOOLS_SIM_FIT_EXPERIMENT_H_
#define TUTTI_TOOLS_SIM_FIT_EXPERIMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/packer/core/cost_schedule.h"
#include "tools/sim/ladder.h"

namespace tutti::sim {

struct FitExperimentOptions {
  uint32_t world_size = 64;
  uint64_t steps = 200;
  double off_by = 4;  // configured quadratic terms over the true ones
  uint64_t max_pixels = packer::kSeedStage2MaxPixels;
  std::string strategy = "tutti";
  bool post_balancing = false;
  uint32_t interval_steps = 25;  // cost.online_fit
  uint32_t min_reports = 128;
  double noise = 0.02;          // relative, per report
  double stalled_share = 0.02;  // reports of a stalled rank (3-10x)
  uint64_t window = 20;         // steps averaged at the start and the end
};

struct FitExperimentResult {
  // Per step, max/mean of the true ViT and LLM seconds across ranks, and of
  // the ranks' compute (the sum of their phases): planned with the fit, with
  // the configured constants throughout, and with the true constants.
  struct Series {
    std::vector<double> vit, llm, compute;
  };
  Series fit, configured, truth;
  std::vector<packer::CostFitEntry> fits;
  uint64_t rounds = 0, refused = 0;
  // Means over the first and the last `window` steps.
  struct Summary {
    double vit = 0, llm = 0, compute = 0;
  };
  Summary before, after, configured_after, truth_after;
};

absl::StatusOr<FitExperimentResult> RunFitExperiment(const SimSetup& setup,
                                                     const FitExperimentOptions& options);

}  // namespace tutti::sim

#endif  // TUTTI_TOOLS_SIM_FIT_EXPERIMENT_H_
