#include "services/packer/core/partition_bound.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

namespace tutti::packer {
namespace {

// Dual feasible functions u_k for k = 1 .. kMaxDff.
constexpr uint32_t kMaxDff = 48;
// Binary-search probes between the simple bound and the known partition.
constexpr int kProbes = 40;
// Mixes of the two dimensions tried (lambda = 1 / kMixSteps, ...).
constexpr int kMixSteps = 10;
// Sizes in the knapsack of LargeItemBound are counted in this many parts
// of the room (rounded so that the knapsack's value can only be larger).
constexpr uint32_t kRoomParts = 1024;
// Relative slack on every "more than" so that rounding never proves a
// capacity impossible that is not.
constexpr double kEps = 1e-9;

// u_k(x) for x in [0, 1]: x when (k+1) x is whole, floor((k+1) x) / k
// otherwise. Within rounding of a whole m, the least of what the exact value
// may be (x, or (m - 1) / k just below m; m / k above it is more than x), so
// that the sum never exceeds its exact value.
double Dff(double x, uint32_t k) {
  const double y = (k + 1) * x;
  const double m = std::round(y);
  if (std::abs(y - m) < kEps) return std::min(x, std::max(0.0, m - 1) / k);
  return std::floor(y) / k;
}

// The largest capacity in [lo, hi] that `proves` shows impossible, by
// bisection; lo itself when none is (each probe stands on its own, so the
// result is a bound whether or not `proves` is monotone).
template <typename Proves>
double Bisect(double lo, double hi, Proves proves) {
  for (int probe = 0; probe < kProbes && hi > lo * (1 + 1e-7); ++probe) {
    const double mid = (lo + hi) / 2;
    if (proves(mid)) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// No two items larger than half the room share a rank, so the rank of
// such an item i holds at most its cost plus the most that the smaller
// items fit into the room it leaves: cap_i = cost_i + K(room - size_i), K
// a knapsack over the items of at most half the room (sizes rounded down
// and rooms up to kRoomParts parts, which can only raise K). Then any
// makespan C has sum_i min(C, cap_i) + (W - large) C >= the total cost;
// the least such C. 0 without large items; `upper` when more large items
// than ranks.
double LargeItemBound(const std::vector<std::pair<double, double>>& items, uint32_t ranks,
                      double room, double upper) {
  const double part = room / kRoomParts;
  std::vector<double> best(kRoomParts + 1, 0.0);  // knapsack value per parts of room
  std::vector<double> large_cost, large_size;
  double total = 0;
  for (const auto& [cost, size] : items) {
    total += cost;
    if (size > room / 2) {
      large_cost.push_back(cost);
      large_size.push_back(size);
      continue;
    }
    const uint32_t w = static_cast<uint32_t>(std::floor(size / part));
    for (uint32_t c = kRoomParts; c >= w && c != UINT32_MAX; --c) {
      best[c] = std::max(best[c], best[c - w] + cost);
    }
  }
  if (large_cost.empty()) return 0;
  if (large_cost.size() > ranks) return upper;
  std::vector<double> caps;
  for (size_t i = 0; i < large_cost.size(); ++i) {
    const double left = std::max(0.0, room - large_size[i]);
    const uint32_t parts =
        std::min<uint32_t>(kRoomParts, static_cast<uint32_t>(std::ceil(left / part - kEps)));
    caps.push_back(large_cost[i] + best[parts]);
  }
  const double others = ranks - static_cast<double>(caps.size());
  auto holds = [&](double c) {
    double sum = others * c;
    for (double cap : caps) sum += std::min(c, cap);
    return sum >= total * (1 - kEps);
  };
  if (others == 0 && !holds(HUGE_VAL)) return upper;  // the large ranks cannot hold it all
  double lo = 0, hi = std::max(upper, total);
  for (int probe = 0; probe < 2 * kProbes; ++probe) {
    const double mid = (lo + hi) / 2;
    if (holds(mid)) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return lo;  // below every C that holds, within the probes
}

}  // namespace

bool ProvablyOverfull(const std::vector<double>& sorted, uint32_t ranks, double capacity) {
  // (Every test below reads the items relative to `capacity`.)
  const size_t n = sorted.size();
  if (n == 0 || ranks == 0) return n > 0;
  if (capacity <= 0) return true;
  const double slack = capacity * kEps;
  if (sorted[0] > capacity + slack) return true;
  const double total = std::accumulate(sorted.begin(), sorted.end(), 0.0);
  if (total > ranks * capacity * (1 + kEps)) return true;
  // Prefix sums of the decreasing items.
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + sorted[i];
  auto count_above = [&](double t) {
    return static_cast<size_t>(
        std::upper_bound(sorted.begin(), sorted.end(), t, std::greater<double>()) - sorted.begin());
  };
  auto count_at_least = [&](double t) {
    return static_cast<size_t>(
        std::lower_bound(sorted.begin(), sorted.end(), t, std::greater<double>()) - sorted.begin());
  };
  // Martello-Toth L2 over K in {0} and every item size up to C / 2.
  const size_t half = count_above(capacity / 2 + slack);  // J1 and J2
  const double s12 = prefix[half];
  auto l2_proves = [&](double k) {
    const size_t j1 = std::min(half, count_above(capacity - k + slack));
    const size_t j2 = half - j1;
    const double s2 = s12 - prefix[j1];
    const size_t j3_end = k > 0 ? count_at_least(k) : n;
    const double s3 = prefix[j3_end] - prefix[half];
    const double spill = s3 - (j2 * capacity - s2);
    const double more = spill > slack * n ? std::ceil(spill / capacity - kEps) : 0.0;
    return j1 + j2 + more > ranks + kEps;
  };
  if (l2_proves(0)) return true;
  for (size_t i = n; i-- > half;) {
    if (i + 1 < n && sorted[i] == sorted[i + 1]) continue;
    if (sorted[i] > 0 && l2_proves(sorted[i])) return true;
  }
  for (uint32_t k = 1; k <= kMaxDff; ++k) {
    double sum = 0;
    for (double w : sorted) sum += Dff(std::min(1.0, w / capacity), k);
    if (sum > ranks * (1 + kEps) + kEps) return true;
  }
  return false;
}

double PartitionLowerBound(const std::vector<std::pair<double, double>>& items, uint32_t ranks,
                           double room, double upper) {
  std::vector<double> costs;
  costs.reserve(items.size());
  for (const auto& [cost, size] : items) costs.push_back(cost);
  double lo = PartitionLowerBound(costs, ranks, upper);
  if (room <= 0 || items.empty() || ranks == 0) return lo;
  lo = std::max(lo, std::min(upper, LargeItemBound(items, ranks, room, upper)));
  // Mixed sizes lambda cost / C + (1 - lambda) size / room: every rank holds
  // at most 1 of them when its cost is at most C and its size fits.
  std::vector<double> mixed(items.size());
  auto proves = [&](double capacity) {
    for (int step = 1; step < kMixSteps; ++step) {
      const double lambda = static_cast<double>(step) / kMixSteps;
      for (size_t i = 0; i < items.size(); ++i) {
        mixed[i] = std::min(
            1.0, lambda * items[i].first / capacity + (1 - lambda) * items[i].second / room);
      }
      std::sort(mixed.begin(), mixed.end(), std::greater<double>());
      if (ProvablyOverfull(mixed, ranks, 1.0)) return true;
    }
    return false;
  };
  return Bisect(lo, upper, proves);
}

double PartitionLowerBound(std::vector<double> items, uint32_t ranks, double upper) {
  if (items.empty() || ranks == 0) return 0;
  std::sort(items.begin(), items.end(), std::greater<double>());
  const size_t n = items.size();
  const double total = std::accumulate(items.begin(), items.end(), 0.0);
  double lo = std::max(total / ranks, items[0]);
  // Pigeonhole: some rank holds k + 1 of the k W + 1 largest items.
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + items[i];
  for (size_t k = 1; k * ranks + 1 <= n; ++k) {
    lo = std::max(lo, prefix[k * ranks + 1] - prefix[k * ranks - k]);
  }
  return Bisect(lo, upper, [&](double c) { return ProvablyOverfull(items, ranks, c); });
}

}  // namespace tutti::packer
