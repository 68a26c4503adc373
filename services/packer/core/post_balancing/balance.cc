#include "services/packer/core/post_balancing/balance.h"

#include <algorithm>
#include <functional>
#include <set>
#include <utility>

namespace tutti::dispatch {

double MakespanLowerBound(const std::vector<double>& costs, uint32_t bins) {
  if (bins == 0) return 0;
  double total = 0, largest = 0;
  for (double c : costs) {
    total += c;
    largest = std::max(largest, c);
  }
  return std::max(total / bins, largest);
}

std::vector<double> BinLoads(const std::vector<double>& costs, uint32_t bins,
                             const std::vector<uint32_t>& assignment) {
  std::vector<double> loads(bins, 0.0);
  for (size_t i = 0; i < costs.size(); ++i) loads[assignment[i]] += costs[i];
  return loads;
}

double Makespan(const std::vector<double>& costs, uint32_t bins,
                const std::vector<uint32_t>& assignment) {
  const auto loads = BinLoads(costs, bins, assignment);
  return loads.empty() ? 0 : *std::max_element(loads.begin(), loads.end());
}

double ImproveMakespan(const std::vector<double>& costs, uint32_t bins, uint32_t rounds,
                       std::vector<uint32_t>* assignment, const MoveFilter& allowed) {
  auto ok = [&](uint32_t item, uint32_t bin) { return !allowed || allowed(item, bin); };
  std::vector<double> loads = BinLoads(costs, bins, *assignment);
  if (bins <= 1) return loads.empty() ? 0 : loads[0];
  // Nothing beats the lower bound; stop within 0.01% of it.
  const double good_enough = MakespanLowerBound(costs, bins) * (1 + 1e-4);
  std::vector<std::vector<uint32_t>> members(bins);
  for (uint32_t i = 0; i < costs.size(); ++i) members[(*assignment)[i]].push_back(i);
  std::set<std::pair<double, uint32_t>> order;  // (load, bin)
  for (uint32_t b = 0; b < bins; ++b) order.insert({loads[b], b});
  auto set_load = [&](uint32_t b, double v) {
    order.erase({loads[b], b});
    loads[b] = v;
    order.insert({v, b});
  };
  constexpr uint32_t kTargets = 8;
  const uint64_t max_steps = uint64_t{rounds} * bins;
  std::vector<uint32_t> targets, sorted;
  for (uint64_t step = 0; step < max_steps; ++step) {
    const uint32_t top = order.rbegin()->second;
    const double peak = loads[top];
    if (peak <= good_enough) break;
    targets.clear();
    for (auto it = order.begin(); it != order.end() && targets.size() < kTargets; ++it) {
      if (it->second != top) targets.push_back(it->second);
    }
    // Best single operation: the one leaving the larger touched bin lowest.
    double best = peak * (1 - 1e-12);
    uint32_t best_item = 0, best_other = 0, best_bin = 0;
    bool best_swap = false, found = false;
    for (uint32_t t : targets) {
      for (uint32_t i : members[top]) {
        if (!ok(i, t)) continue;
        const double moved = std::max(peak - costs[i], loads[t] + costs[i]);
        if (moved < best)
          best = moved, best_item = i, best_bin = t, best_swap = false, found = true;
      }
    }
    if (!found) {
      // Swap i (top) with j (t): top drops by d = c_i - c_j > 0, t rises by
      // d; the best d is the one closest to half the gap between them.
      for (uint32_t t : targets) {
        const double gap = peak - loads[t];
        sorted.assign(members[t].begin(), members[t].end());
        std::sort(sorted.begin(), sorted.end(), [&](uint32_t a, uint32_t b) {
          return costs[a] != costs[b] ? costs[a] < costs[b] : a < b;
        });
        for (uint32_t i : members[top]) {
          if (!ok(i, t)) continue;
          const double want = costs[i] - gap / 2;  // ideal partner cost
          auto it = std::lower_bound(sorted.begin(), sorted.end(), want,
                                     [&](uint32_t j, double v) { return costs[j] < v; });
          for (auto k : {it, it == sorted.begin() ? it : it - 1}) {
            if (k == sorted.end()) continue;
            const uint32_t j = *k;
            const double d = costs[i] - costs[j];
            if (d <= 0 || !ok(j, top)) continue;
            const double swapped = std::max(peak - d, loads[t] + d);
            if (swapped < best) {
              best = swapped, best_item = i, best_other = j, best_bin = t, best_swap = true;
              found = true;
            }
          }
        }
      }
    }
    if (!found) break;
    auto erase = [&](uint32_t bin, uint32_t item) {
      auto& m = members[bin];
      m.erase(std::find(m.begin(), m.end(), item));
    };
    erase(top, best_item);
    members[best_bin].push_back(best_item);
    (*assignment)[best_item] = best_bin;
    double top_load = loads[top] - costs[best_item];
    double bin_load = loads[best_bin] + costs[best_item];
    if (best_swap) {
      erase(best_bin, best_other);
      members[top].push_back(best_other);
      (*assignment)[best_other] = top;
      bin_load -= costs[best_other];
      top_load += costs[best_other];
    }
    set_load(top, top_load);
    set_load(best_bin, bin_load);
  }
  return order.rbegin()->first;
}

std::vector<uint32_t> BalancePartition(const std::vector<double>& costs, uint32_t bins,
                                       uint32_t kk_max_bins, uint32_t rounds) {
  std::vector<uint32_t> best = LptPartition(costs, bins);
  double best_span = ImproveMakespan(costs, bins, rounds, &best);
  if (bins > 1 && bins <= kk_max_bins) {
    std::vector<uint32_t> kk = KarmarkarKarpPartition(costs, bins, packer::KkSums::kRebased);
    const double kk_span = ImproveMakespan(costs, bins, rounds, &kk);
    if (kk_span < best_span) best = std::move(kk);
  }
  return best;
}

}  // namespace tutti::dispatch
