#include "services/packer/core/cost_fit.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tutti::packer {
namespace {

constexpr int kParams = 3;  // intercept, linear, quadratic
constexpr double kTukey = 4.685;
constexpr double kMadToSigma = 1.4826;
constexpr int kConcentrationSteps = 12;
constexpr int kIrlsSteps = 50;
// The design's columns, normalised, must keep this much of their own
// spread apart from each other (the determinant of their correlation).
constexpr double kMinIndependence = 1e-6;

// Samples with features and times divided by typical values, so that the
// normal equations are well conditioned whatever the units.
struct Scaled {
  std::vector<std::array<double, kParams>> x;
  std::vector<double> y;
  double sx = 1, sy = 1;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  double m = v[mid];
  if (v.size() % 2 == 0) m = (m + *std::max_element(v.begin(), v.begin() + mid)) / 2;
  return m;
}

// Weighted least squares over the parameters in `mask` (bit i: parameter i);
// the others are 0. False when the system is singular.
bool SolveSubset(const Scaled& s, const std::vector<double>& w, unsigned mask,
                 std::array<double, kParams>* beta) {
  int idx[kParams], k = 0;
  for (int i = 0; i < kParams; ++i) {
    if (mask & (1u << i)) idx[k++] = i;
  }
  double m[kParams][kParams + 1] = {};
  for (size_t n = 0; n < s.y.size(); ++n) {
    if (w[n] <= 0) continue;
    for (int i = 0; i < k; ++i) {
      const double xi = s.x[n][idx[i]];
      for (int j = 0; j < k; ++j) m[i][j] += w[n] * xi * s.x[n][idx[j]];
      m[i][k] += w[n] * xi * s.y[n];
    }
  }
  double scale = 0;
  for (int i = 0; i < k; ++i) scale = std::max(scale, std::abs(m[i][i]));
  if (scale <= 0) return false;
  // Gaussian elimination with partial pivoting.
  for (int c = 0; c < k; ++c) {
    int p = c;
    for (int r = c + 1; r < k; ++r) {
      if (std::abs(m[r][c]) > std::abs(m[p][c])) p = r;
    }
    if (std::abs(m[p][c]) <= 1e-12 * scale) return false;
    for (int j = 0; j <= k; ++j) std::swap(m[c][j], m[p][j]);
    for (int r = 0; r < k; ++r) {
      if (r == c) continue;
      const double f = m[r][c] / m[c][c];
      for (int j = c; j <= k; ++j) m[r][j] -= f * m[c][j];
    }
  }
  beta->fill(0);
  for (int i = 0; i < k; ++i) (*beta)[idx[i]] = m[i][k] / m[i][i];
  return true;
}

double Predict(const std::array<double, kParams>& x, const std::array<double, kParams>& b) {
  return b[0] * x[0] + b[1] * x[1] + b[2] * x[2];
}

// The non-negative weighted least-squares fit: the feasible subset of
// parameters with the least weighted squared error.
bool Solve(const Scaled& s, const std::vector<double>& w, bool intercept,
           std::array<double, kParams>* beta) {
  double best = INFINITY;
  for (unsigned mask = 1; mask < (1u << kParams); ++mask) {
    if (!intercept && (mask & 1u)) continue;
    std::array<double, kParams> b;
    if (!SolveSubset(s, w, mask, &b)) continue;
    if (b[0] < 0 || b[1] < 0 || b[2] < 0) continue;
    double sse = 0;
    for (size_t n = 0; n < s.y.size(); ++n) {
      const double r = s.y[n] - Predict(s.x[n], b);
      sse += w[n] * r * r;
    }
    if (sse < best) best = sse, *beta = b;
  }
  return std::isfinite(best);
}

std::vector<double> AbsResiduals(const Scaled& s, const std::array<double, kParams>& b) {
  std::vector<double> r(s.y.size());
  for (size_t n = 0; n < s.y.size(); ++n) r[n] = std::abs(s.y[n] - Predict(s.x[n], b));
  return r;
}

// The determinant of the correlation matrix of the weighted design's
// non-constant columns (centred when there is an intercept): 1 for
// unrelated columns, 0 for columns that are multiples of each other.
double Independence(const Scaled& s, const std::vector<double>& w, bool intercept) {
  double sw = 0, mean[kParams] = {};
  for (size_t n = 0; n < s.y.size(); ++n) {
    sw += w[n];
    for (int i = 1; i < kParams; ++i) mean[i] += w[n] * s.x[n][i];
  }
  if (sw <= 0) return 0;
  for (int i = 1; i < kParams; ++i) mean[i] = intercept ? mean[i] / sw : 0;
  double c11 = 0, c22 = 0, c12 = 0;
  for (size_t n = 0; n < s.y.size(); ++n) {
    const double a = s.x[n][1] - mean[1], b = s.x[n][2] - mean[2];
    c11 += w[n] * a * a;
    c22 += w[n] * b * b;
    c12 += w[n] * a * b;
  }
  if (c11 <= 0 || c22 <= 0) return 0;
  return 1 - c12 * c12 / (c11 * c22);
}

}  // namespace

absl::StatusOr<PhaseFit> FitPhase(absl::Span<const FitSample> samples, const FitOptions& o) {
  for (size_t n = 0; n < samples.size(); ++n) {
    const FitSample& f = samples[n];
    for (const auto& [name, v] : {std::pair<const char*, double>{"sum_x", f.linear},
                                  {"sum_x2", f.quadratic},
                                  {"seconds", f.seconds}}) {
      if (!std::isfinite(v) || v < 0) {
        return absl::InvalidArgumentError(absl::StrCat("fit sample ", n, ": ", name, " is ", v,
                                                       "; features and times are finite and >= 0"));
      }
    }
  }
  const uint32_t N = static_cast<uint32_t>(samples.size());
  if (N < std::max<uint32_t>(o.min_samples, 3)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a fit needs at least ", std::max<uint32_t>(o.min_samples, 3), " samples; it has ", N));
  }
  Scaled s;
  {
    std::vector<double> xs, ys;
    for (const FitSample& f : samples) {
      if (f.linear > 0) xs.push_back(f.linear);
      if (f.seconds > 0) ys.push_back(f.seconds);
    }
    s.sx = xs.empty() ? 1 : Median(xs);
    s.sy = ys.empty() ? 1 : Median(ys);
    if (!(s.sx > 0)) s.sx = 1;
    if (!(s.sy > 0)) s.sy = 1;
  }
  s.x.resize(N);
  s.y.resize(N);
  for (uint32_t n = 0; n < N; ++n) {
    s.x[n] = {1.0, samples[n].linear / s.sx, samples[n].quadratic / (s.sx * s.sx)};
    s.y[n] = samples[n].seconds / s.sy;
  }
  std::vector<double> w(N, 1.0);
  std::array<double, kParams> beta{};
  if (!Solve(s, w, o.intercept, &beta)) {
    return absl::FailedPreconditionError(
        "the samples' features are all zero or equal: nothing to fit");
  }
  // Least trimmed squares by concentration: refit on the half of the
  // samples closest to the current fit until that half stops changing.
  const uint32_t h = N / 2 + 2;
  std::vector<uint32_t> order(N);
  for (int it = 0; it < kConcentrationSteps; ++it) {
    const std::vector<double> r = AbsResiduals(s, beta);
    for (uint32_t n = 0; n < N; ++n) order[n] = n;
    std::nth_element(
        order.begin(), order.begin() + (h - 1), order.end(),
        [&](uint32_t a, uint32_t b) { return r[a] < r[b] || (r[a] == r[b] && a < b); });
    std::vector<double> keep(N, 0.0);
    for (uint32_t k = 0; k < h; ++k) keep[order[k]] = 1;
    if (keep == w && it > 0) break;
    w = keep;
    if (!Solve(s, w, o.intercept, &beta)) break;
  }
  // Tukey's biweight from there.
  double sigma = 0;
  for (int it = 0; it < kIrlsSteps; ++it) {
    const std::vector<double> r = AbsResiduals(s, beta);
    sigma = kMadToSigma * Median(r);
    if (!(sigma > 1e-12)) sigma = 1e-12;
    std::vector<double> nw(N);
    for (uint32_t n = 0; n < N; ++n) {
      const double u = r[n] / (kTukey * sigma);
      nw[n] = u < 1 ? (1 - u * u) * (1 - u * u) : 0.0;
    }
    std::array<double, kParams> next;
    if (!Solve(s, nw, o.intercept, &next)) break;
    double moved = 0;
    for (int i = 0; i < kParams; ++i) {
      moved = std::max(moved, std::abs(next[i] - beta[i]) / (std::abs(beta[i]) + 1e-9));
    }
    beta = next;
    w = std::move(nw);
    if (moved < 1e-9) break;
  }
  PhaseFit fit;
  fit.samples = N;
  fit.intercept = beta[0] * s.sy;
  fit.linear = beta[1] * s.sy / s.sx;
  fit.quadratic = beta[2] * s.sy / (s.sx * s.sx);
  fit.scale = sigma * s.sy;
  double sw = 0, ym = 0;
  for (uint32_t n = 0; n < N; ++n) {
    fit.outliers += w[n] <= 0;
    sw += w[n];
    ym += w[n] * s.y[n];
  }
  if (fit.outliers > o.max_outlier_share * N) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%u of %u samples are far off any fit (more than %.0f%%): the times do not follow "
        "c + a*sum(x) + b*sum(x^2) (stalls or a changing machine?)",
        fit.outliers, N, 100 * o.max_outlier_share));
  }
  const double independence = Independence(s, w, o.intercept);
  if (independence < kMinIndependence) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the samples' sum(x) and sum(x^2) move together (independence %.2g): they cannot tell the "
        "linear from the quadratic term; they need items of different sizes on different ranks",
        independence));
  }
  ym /= sw;
  double sst = 0, sse = 0;
  for (uint32_t n = 0; n < N; ++n) {
    const double r = s.y[n] - Predict(s.x[n], beta);
    sse += w[n] * r * r;
    sst += w[n] * (s.y[n] - ym) * (s.y[n] - ym);
  }
  fit.explained = sst > 0 ? 1 - sse / sst : (sse <= 1e-18 ? 1.0 : 0.0);
  if (fit.explained < o.min_explained) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the fit explains %.0f%% of the times' spread (at least %.0f%% needed): the times do not "
        "follow c + a*sum(x) + b*sum(x^2)",
        100 * fit.explained, 100 * o.min_explained));
  }
  return fit;
}

}  // namespace tutti::packer
