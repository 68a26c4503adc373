// Fitting a phase's cost constants to measured times, robustly.
//
// A phase's time on one rank is modelled as
//     seconds = c + a * sum(x) + b * sum(x^2)
// over the rank's items of that phase: images (x = patches) for "vit",
// audio clips (x = tokens) for "audio", documents (x = tokens) for "llm";
// c absorbs what a step costs whatever it holds (launches, the optimizer's
// share). FitPhase finds c, a, b >= 0 from (sum x, sum x^2, seconds)
// samples so that samples far off the fit (a rank that stalled on I/O, a
// preempted process) carry no weight: least trimmed squares (concentration
// steps from the ordinary fit, half of the samples kept) to start, then
// Tukey's biweight (c = 4.685 robust standard deviations, the scale from the
// median absolute residual) to convergence. It refuses, naming why, rather
// than return a fit that drifts: too few samples, features that do not
// vary enough to tell the linear from the quadratic term, too many samples
// far off any fit, or a fit that explains too little of the inliers' spread.
//
// The same fit reads calibration pairs (one item per sample: sum x = x,
// sum x^2 = x^2), the online fit's per-rank reports (online_fit.h) and the
// simulator's synthetic timings.
#ifndef TUTTI_SERVICES_PACKER_CORE_COST_FIT_H_
#define TUTTI_SERVICES_PACKER_CORE_COST_FIT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tutti::packer {

struct FitSample {
  double linear = 0;     // sum of x over the rank's items
  double quadratic = 0;  // sum of x^2
  double seconds = 0;
};

struct FitOptions {
  uint32_t min_samples = 32;       // fewer: FAILED_PRECONDITION
  double max_outlier_share = 0.4;  // more samples with no weight: refused
  double min_explained = 0.5;      // of the inliers' variance; less: refused
  bool intercept = true;           // fit c (false: c = 0)
};

struct PhaseFit {
  double intercept = 0;  // c, seconds
  double linear = 0;     // a, seconds per unit of x
  double quadratic = 0;  // b, seconds per unit of x^2
  uint32_t samples = 0;
  uint32_t outliers = 0;  // samples given no weight
  double scale = 0;       // robust standard deviation of the residuals, seconds
  double explained = 0;   // share of the inliers' variance the fit explains
  double Seconds(double sum_x, double sum_x2) const {
    return intercept + linear * sum_x + quadratic * sum_x2;
  }
};

// INVALID_ARGUMENT naming the sample for a value that is NaN, infinite or
// negative; FAILED_PRECONDITION naming why for a fit it refuses.
absl::StatusOr<PhaseFit> FitPhase(absl::Span<const FitSample> samples,
                                  const FitOptions& options = {});

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_COST_FIT_H_
