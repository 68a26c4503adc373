// Measured (patches, seconds) and (tokens, seconds) pairs, as
// tools/gpu_calibrate.py writes them on a GPU machine, fitted to the time
// model's constants (seconds = a*x + b*x^2 per item, forward and backward,
// the whole encoder or LLM) with the robust fit the packer's online fit uses
// (services/packer/core/cost_fit.h).
//
// The file: '#' comment lines (the script's date, device and shapes), then
// one pair per line:
//   vit sdpa <patches> <seconds>     the ViT with fused attention
//   vit eager <patches> <seconds>    the ViT with eager attention
//   llm flash <tokens> <seconds>     the LLM, one document of that length
#ifndef TUTTI_TOOLS_SIM_CALIBRATION_H_
#define TUTTI_TOOLS_SIM_CALIBRATION_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/packer/core/cost_fit.h"
#include "tools/sim/cluster.h"

namespace tutti::sim {

struct CalibrationPairs {
  std::vector<packer::FitSample> vit_sdpa, vit_eager, llm;
  std::vector<std::string> comments;
};

// DATA_LOSS naming `origin` and the line for one it cannot read, or a count
// or time that is NaN, negative or zero.
absl::StatusOr<CalibrationPairs> ParseCalibration(const std::string& text,
                                                  const std::string& origin);
absl::StatusOr<CalibrationPairs> ReadCalibration(const std::string& path);

struct Calibrated {
  packer::PhaseFit vit, llm;
  ItemTiming timing;  // vit and llm from the pairs; audio from `fallback`
};
// FAILED_PRECONDITION naming the phase when it has too few pairs (4) or the
// fit refuses them.
absl::StatusOr<Calibrated> FitCalibration(const CalibrationPairs& pairs, Attention attention,
                                          const ItemTiming& fallback);

}  // namespace tutti::sim

#endif  // TUTTI_TOOLS_SIM_CALIBRATION_H_
