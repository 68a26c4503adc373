// A lower bound on the slowest rank's cost of any partition of a step's
// items over W ranks, tighter than max(mean, largest item) where the items
// are few per rank or come in a few sizes (a step's VL samples at a low
// max-pixel stage: one to four images of nearly the same cost each).
//
// A makespan C is impossible when W bins of capacity C cannot hold the
// items, which bin-packing lower bounds certify:
//  - pigeonhole: among the k W + 1 largest items some rank holds k + 1, so
//    C is at least the sum of the k + 1 smallest of them (k = 1, 2, ...);
//  - Martello and Toth's L2 (items above C - K, above C / 2, and the rest
//    from K up by volume into the room the large ones leave);
//  - Fekete and Schepers' dual feasible functions u_k (x -> x when (k+1) x
//    is whole, floor((k+1) x) / k otherwise, x the item over C): if the
//    items' u_k sum to more than W, no W bins hold them.
// The bound is the largest C the search proves impossible (a binary search
// between max(mean, largest) and `upper`, each probe proven on its own, so
// the result is a valid bound whether or not the tests are monotone in C).
// Not a quantity the planner optimises: the benchmark reports the slowest
// rank over it, to tell how far a plan is from what any plan can reach.
#ifndef TUTTI_SERVICES_PACKER_CORE_PARTITION_BOUND_H_
#define TUTTI_SERVICES_PACKER_CORE_PARTITION_BOUND_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace tutti::packer {

// The bound for `items` (non-negative costs, any order) on `ranks` ranks;
// `upper` is the cost of a known partition (the search stops there). 0
// without items or ranks.
double PartitionLowerBound(std::vector<double> items, uint32_t ranks, double upper);

// The same with a second dimension: item i is (cost, size) and each rank
// holds items of at most `room` size in all (a rank's VL samples share its
// VL sequences' tokens), so a makespan C is also impossible when the mixed
// sizes lambda cost / C + (1 - lambda) size / room (lambda = 0.1 ... 0.9)
// fail the tests above with capacity 1; and no two items larger than half
// the room share a rank, so the rank of each such item holds at most its
// cost plus what the smaller items fit into the room it leaves (a
// knapsack), which the other ranks' share must make up. At least the bound
// of the costs alone.
double PartitionLowerBound(const std::vector<std::pair<double, double>>& items, uint32_t ranks,
                           double room, double upper);

// Whether the bin-packing tests above prove that `ranks` bins of capacity
// `capacity` cannot hold `sorted` (decreasing).
bool ProvablyOverfull(const std::vector<double>& sorted, uint32_t ranks, double capacity);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_PARTITION_BOUND_H_
