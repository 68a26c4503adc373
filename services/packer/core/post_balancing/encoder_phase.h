// One encoder phase (vision or audio): every item (an image or an audio clip)
// is encoded on one rank; the phase is balanced on that encoder's cost.
// Items carry no capacity constraint, so the node-oblivious balance is plain
// multiway partitioning (balance.h). The node-aware placement keeps, within
// the balance bound, each item on a node that stages its shard (so its input
// is loaded locally) and the items of one sample on one node (so the LLM
// phase can take the sample's encoder outputs without crossing nodes).
#ifndef TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_ENCODER_PHASE_H_
#define TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_ENCODER_PHASE_H_

#include <cstdint>
#include <vector>

#include "services/packer/core/post_balancing/dispatch_types.h"

namespace tutti::dispatch {

inline constexpr uint32_t kNoNode = ~0u;

struct EncoderProblem {
  ClusterShape cluster;
  std::vector<double> cost;     // per item
  std::vector<uint32_t> shard;  // per item
  std::vector<uint32_t> group;  // per item: its sample; a group's items are contiguous
  const ShardAvailability* availability = nullptr;  // nullptr: every shard on every node
  const StagingIndex* staging = nullptr;            // the same as lists; set with availability
  bool Staged(uint32_t item, uint32_t node) const {
    return availability == nullptr || availability->Has(shard[item], node);
  }
};

// Node-oblivious: the best of LPT and Karmarkar-Karp (for at most
// kk_max_ranks ranks), improved by local search.
std::vector<uint32_t> BalanceEncoder(const EncoderProblem& problem, uint32_t kk_max_ranks,
                                     uint32_t rounds);

struct EncoderPlacement {
  std::vector<uint32_t> rank;  // per item
  double bound = 0;            // the balance bound the placement keeps to
  bool fell_back = false;      // the node-aware greedy missed (1+tolerance)*LB
};

// Node-aware greedy within `bound`: samples in decreasing cost to the least
// loaded node staging their shard, their items in decreasing cost to the
// least loaded rank of that node while within the bound, else to the least
// loaded rank of any staging node, else anywhere (remote load); then local
// search inside every node. `within` tells whether every rank kept to it.
std::vector<uint32_t> GreedyEncoderNodeAware(const EncoderProblem& problem, double bound,
                                             uint32_t rounds, bool* within);

// The phase's placement. Node-aware: the greedy within (1 + tolerance) *
// lower bound; if it misses, the greedy again within (1 + tolerance) * the
// makespan of the balanced partition (best of LPT and KK, improved), and if
// that misses too, that partition with remote loads pulled onto staging
// nodes within the same bound. Node-oblivious: the balanced partition,
// bound (1 + tolerance) * max(its makespan, lower bound).
EncoderPlacement PlaceEncoder(const EncoderProblem& problem, bool node_aware, double tolerance,
                              uint32_t kk_max_ranks, uint32_t rounds);

// Moves items onto their preferred node (kNoNode: no preference), heaviest
// `weight` first, to the least loaded rank there within `bound`, or swaps
// two items that each prefer the other's node. Never moves an item off a
// node staging its shard onto one that does not.
// Returns, per node, whether any item moved onto or off it.
std::vector<uint8_t> MoveTowardNodes(const EncoderProblem& problem,
                                     const std::vector<uint32_t>& preferred,
                                     const std::vector<uint64_t>& weight, double bound,
                                     std::vector<uint32_t>* rank);

// Lowers the makespan toward `target`, stopping once every rank is within
// it: moves and swaps off the most loaded rank (to the two least loaded
// other ranks of its node while the node holds no more than `target` a
// rank, else to the 8 least loaded ranks elsewhere, then the next 56 when
// none of those takes a change), each lowering the larger of the two ranks
// it touches. A change that adds no bytes is taken first (the one that
// leaves those ranks lowest); otherwise the one adding the fewest bytes per
// unit of the makespan it takes off down to `target`. An item's bytes are
// its `weight` while it is off its preferred node (kNoNode: none anywhere)
// plus its `load_weight` while on a node that does not stage its shard (a
// remote load). At most rounds x ranks changes. Returns the makespan after.
double RebalanceFewestBytes(const EncoderProblem& problem, const std::vector<uint32_t>& preferred,
                            const std::vector<uint64_t>& weight,
                            const std::vector<uint64_t>& load_weight, double target,
                            uint32_t rounds, std::vector<uint32_t>* rank);

// Lowers the makespan inside every node (or the nodes flagged in `only`)
// without changing any item's node.
void ImproveWithinNodes(const EncoderProblem& problem, uint32_t rounds, std::vector<uint32_t>* rank,
                        const std::vector<uint8_t>* only = nullptr);

}  // namespace tutti::dispatch

#endif  // TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_ENCODER_PHASE_H_
