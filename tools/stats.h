// Timing and summary helpers the `tutti` subcommands share.
#ifndef TUTTI_TOOLS_STATS_H_
#define TUTTI_TOOLS_STATS_H_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <vector>

namespace tutti::tools {

// Seconds of the steady clock since `t0`.
inline double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The nearest-rank q-quantile of `v` (q in [0, 1]; 0 when empty).
inline double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(std::ceil(q * v.size())) - (q > 0));
  return v[i];
}

inline double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

}  // namespace tutti::tools

#endif  // TUTTI_TOOLS_STATS_H_
