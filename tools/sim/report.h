// The simulator's output: the ladder as a table or JSON, the fit
// experiment's summary, and a PNG of the ladder and the per-rank load
// spread drawn with matplotlib.
#ifndef TUTTI_TOOLS_SIM_REPORT_H_
#define TUTTI_TOOLS_SIM_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/sim/fit_experiment.h"
#include "tools/sim/ladder.h"

namespace tutti::sim {

// One ladder's results (one world size, stage and setup).
struct LadderRun {
  uint32_t world_size = 0;
  uint64_t stage_max_pixels = 0;
  std::vector<RungResult> rungs;
};

std::string LadderTable(const SimSetup& setup, const std::vector<LadderRun>& runs);
std::string LadderJson(const SimSetup& setup, const std::vector<LadderRun>& runs);
std::string FitExperimentText(const FitExperimentOptions& o, const FitExperimentResult& r);
std::string FitExperimentJson(const FitExperimentOptions& o, const FitExperimentResult& r);

// Draws the ladder (tokens/s per GPU and efficiency per rung) and each
// rung's per-rank load spread from LadderJson's output into `png`, with
// `python` (matplotlib). The error names what failed and the fix.
absl::Status PlotLadder(const std::string& json, const std::string& png, const std::string& python);

}  // namespace tutti::sim

#endif  // TUTTI_TOOLS_SIM_REPORT_H_
