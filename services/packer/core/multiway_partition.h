// Multiway number partitioning (P||Cmax): items with non-negative costs onto
// `bins` identical bins so that the largest bin load (makespan) is small.
// The one implementation of the two classic heuristics, used by the peer
// packing strategies (lpt, kk: peer_strategies.cc) and by post-balancing's
// encoder phases (post_balancing/balance.h). Deterministic: ties break on
// the lower item index and the lower bin index.
#ifndef TUTTI_SERVICES_PACKER_CORE_MULTIWAY_PARTITION_H_
#define TUTTI_SERVICES_PACKER_CORE_MULTIWAY_PARTITION_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

namespace tutti::packer {

// Items 0..n-1 by decreasing cost(i), ties by the lower index.
template <typename Cost>
std::vector<uint32_t> DecreasingOrder(uint32_t n, Cost cost) {
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return cost(a) > cost(b); });
  return order;
}

// Longest processing time first: the items of `order`, in that order, each
// onto the bin with the least load (ties: the lower bin) for which
// take(bin, item) is true; that bin's load grows by cost(item) and
// placed(bin, item) is called. `loads` holds the bins' starting loads.
// Returns the position in `order` of the first item no bin takes (nothing
// after it is placed), or -1 when every item was placed.
template <typename Cost, typename Take, typename Placed>
int64_t LptPlace(const std::vector<uint32_t>& order, std::vector<double>* loads, Cost cost,
                 Take take, Placed placed) {
  std::set<std::pair<double, uint32_t>> bins;  // (load, bin), least first
  for (uint32_t b = 0; b < loads->size(); ++b) bins.insert({(*loads)[b], b});
  for (size_t k = 0; k < order.size(); ++k) {
    const uint32_t i = order[k];
    auto it = bins.begin();
    while (it != bins.end() && !take(it->second, i)) ++it;
    if (it == bins.end()) return static_cast<int64_t>(k);
    const uint32_t b = it->second;
    bins.erase(it);
    (*loads)[b] += cost(i);
    bins.insert({(*loads)[b], b});
    placed(b, i);
  }
  return -1;
}

// LPT without constraints: each item's bin, from empty bins, items by
// decreasing cost. O(n log n + n log bins); makespan <= (4/3 - 1/(3 bins))
// OPT.
std::vector<uint32_t> LptPartition(const std::vector<double>& costs, uint32_t bins);

// Karmarkar-Karp largest differencing for `bins` ways: every item starts as
// a partition with one non-empty part; the two partitions with the largest
// spread (heaviest part minus lightest, ties: the older partition) are
// merged, heaviest part with lightest, until one is left. Returns each
// item's part, parts numbered by decreasing sum (ties in the merge's
// order), so part 0 is the heaviest. O(n log n + n bins log bins) time;
// only non-empty parts are kept (memory O(n + bins) per live partition).
//
// `sums`: kRebased subtracts the lightest part's sum from every part once
// a partition has `bins` non-empty parts (post-balancing's partitions: the
// sums stay small), kAbsolute keeps them (the peer strategies'). The two
// differ only where sums that tie in exact arithmetic round apart; each
// caller keeps the form its plans were made with.
enum class KkSums { kAbsolute, kRebased };
std::vector<uint32_t> KarmarkarKarpPartition(const std::vector<double>& costs, uint32_t bins,
                                             KkSums sums = KkSums::kAbsolute);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_MULTIWAY_PARTITION_H_
