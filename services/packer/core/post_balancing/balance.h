// Multiway number partitioning (P||Cmax): place independent items with
// costs on `bins` identical bins so the largest bin load (makespan) is small.
// Used for encoder phases, whose items (images, audio clips) carry no
// capacity constraint. All functions are deterministic: ties break on the
// lower item index and the lower bin index.
#ifndef TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_BALANCE_H_
#define TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_BALANCE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "services/packer/core/multiway_partition.h"

namespace tutti::dispatch {

// max(sum / bins, largest item): no placement has a smaller makespan.
double MakespanLowerBound(const std::vector<double>& costs, uint32_t bins);

std::vector<double> BinLoads(const std::vector<double>& costs, uint32_t bins,
                             const std::vector<uint32_t>& assignment);
double Makespan(const std::vector<double>& costs, uint32_t bins,
                const std::vector<uint32_t>& assignment);

// LPT and Karmarkar-Karp: the packer's one implementation of each.
using packer::KarmarkarKarpPartition;
using packer::LptPartition;

// Local search on the most loaded bin: moves an item to the least loaded bin,
// or swaps it with a smaller item of one of the least loaded bins, while that
// lowers the larger of the two bins touched. At most rounds * bins steps.
// With `allowed`, only moves allowed(item, to_bin) are made (both items of a
// swap). Returns the makespan after.
using MoveFilter = std::function<bool(uint32_t item, uint32_t to_bin)>;
double ImproveMakespan(const std::vector<double>& costs, uint32_t bins, uint32_t rounds,
                       std::vector<uint32_t>* assignment, const MoveFilter& allowed = nullptr);

// The best of LPT and (when bins <= kk_max_bins) Karmarkar-Karp, each
// improved by ImproveMakespan.
std::vector<uint32_t> BalancePartition(const std::vector<double>& costs, uint32_t bins,
                                       uint32_t kk_max_bins, uint32_t rounds);

}  // namespace tutti::dispatch

#endif  // TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_BALANCE_H_
