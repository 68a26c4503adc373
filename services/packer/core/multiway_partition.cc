#include "services/packer/core/multiway_partition.h"

#include <queue>

namespace tutti::packer {
namespace {

// One part of a Karmarkar-Karp partition: its sum and its items, as a
// linked list through `next`.
struct Part {
  double sum;
  int32_t head, tail;
};

// Appends from's items to into's.
void Join(Part* into, const Part& from, std::vector<int32_t>* next) {
  if (from.head < 0) return;
  into->sum += from.sum;
  if (into->head < 0) {
    into->head = from.head;
  } else {
    (*next)[into->tail] = from.head;
  }
  into->tail = from.tail;
}

}  // namespace

std::vector<uint32_t> LptPartition(const std::vector<double>& costs, uint32_t bins) {
  std::vector<uint32_t> assignment(costs.size(), 0);
  if (bins <= 1) return assignment;
  std::vector<double> loads(bins, 0.0);
  const auto cost = [&](uint32_t i) { return costs[i]; };
  LptPlace(
      DecreasingOrder(static_cast<uint32_t>(costs.size()), cost), &loads, cost,
      [](uint32_t, uint32_t) { return true; },
      [&](uint32_t bin, uint32_t i) { assignment[i] = bin; });
  return assignment;
}

std::vector<uint32_t> KarmarkarKarpPartition(const std::vector<double>& costs, uint32_t bins,
                                             KkSums sums) {
  const size_t W = bins;
  std::vector<uint32_t> part_of(costs.size(), 0);
  if (bins <= 1 || costs.empty()) return part_of;
  std::vector<int32_t> next(costs.size(), -1);
  // A partition: its non-empty parts by decreasing sum (the rest are empty).
  std::vector<std::vector<Part>> parts;
  parts.reserve(costs.size());
  using Entry = std::pair<double, int64_t>;  // spread, -id (lower id first on ties)
  std::priority_queue<Entry> heap;
  auto spread = [&](const std::vector<Part>& v) {
    if (v.empty()) return 0.0;
    return v.front().sum - (v.size() < W ? 0.0 : v.back().sum);
  };
  for (uint32_t i = 0; i < costs.size(); ++i) {
    parts.push_back({Part{costs[i], int32_t(i), int32_t(i)}});
    heap.push({spread(parts.back()), -int64_t(i)});
  }
  // Merging x (popped first) with y: index i of a W-way partition holds
  // x's part i and y's part W - 1 - i; the merged parts are sorted by
  // decreasing sum, ties in index order. x's parts before the first index
  // that y reaches are already sorted and stay in place; the rest (joined
  // parts, then y's alone, by increasing index) are sorted and merged in.
  const auto by_sum = [](const Part& l, const Part& r) { return l.sum > r.sum; };
  std::vector<Part> rest;
  while (heap.size() > 1) {
    const int64_t a = -heap.top().second;
    heap.pop();
    const int64_t b = -heap.top().second;
    heap.pop();
    std::vector<Part>& x = parts[a];
    std::vector<Part>& y = parts[b];
    const size_t nx = x.size(), ny = y.size();
    const size_t pure = std::min(nx, W - ny);
    rest.clear();
    for (size_t i = pure; i < nx; ++i) {
      Part e = x[i];
      if (W - 1 - i < ny) Join(&e, y[W - 1 - i], &next);
      rest.push_back(e);
    }
    for (size_t i = std::max(nx, W - ny); i < W; ++i) rest.push_back(y[W - 1 - i]);
    std::stable_sort(rest.begin(), rest.end(), by_sum);
    x.resize(pure);
    x.insert(x.end(), rest.begin(), rest.end());
    if (pure > 0 && !rest.empty() && rest.front().sum > x[pure - 1].sum) {
      std::inplace_merge(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(pure), x.end(), by_sum);
    }
    if (sums == KkSums::kRebased && x.size() == W) {
      const double base = x.back().sum;
      for (Part& part : x) part.sum -= base;
    }
    std::vector<Part>().swap(y);
    heap.push({spread(x), -a});
  }
  const std::vector<Part>& final_parts = parts[-heap.top().second];
  for (size_t k = 0; k < final_parts.size(); ++k) {
    for (int32_t i = final_parts[k].head; i >= 0; i = next[i])
      part_of[i] = static_cast<uint32_t>(k);
  }
  return part_of;
}

}  // namespace tutti::packer
