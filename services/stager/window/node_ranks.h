// Which ranks one tutti-stagerd serves: those of its node,
// node * ranks_per_node + [0, ranks_per_node). The node is fixed at start
// (--node N) or learned from the first client that asks (--node=auto: node =
// rank / ranks_per_node); a client of another node is then refused with a
// message naming both nodes.
//
// Not thread-safe: StagerCore keeps it under its lock.
#ifndef TUTTI_SERVICES_STAGER_WINDOW_NODE_RANKS_H_
#define TUTTI_SERVICES_STAGER_WINDOW_NODE_RANKS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tutti::stager {

class NodeRanks {
 public:
  // node: this node's index, or nullopt to learn it from the first client.
  // INVALID_ARGUMENT when the node does not exist in a job of `world_size`
  // ranks, `ranks_per_node` per node.
  static absl::StatusOr<NodeRanks> Make(std::optional<uint32_t> node, uint32_t ranks_per_node,
                                        uint32_t world_size);

  bool known() const { return known_; }
  uint32_t node() const { return node_; }
  uint32_t first() const { return node_ * per_node_; }
  uint32_t per_node() const { return per_node_; }
  // This node's ranks (empty while the node is not known).
  std::vector<uint32_t> ranks() const;
  bool IsLocal(uint32_t rank) const { return known_ && rank / per_node_ == node_; }

  // Under --node=auto, fixes the node from the first client's rank (no-op once
  // known). INVALID_ARGUMENT for a rank outside the job.
  absl::Status Learn(uint32_t rank);
  // OK for a local rank; otherwise INVALID_ARGUMENT naming the rank's node and
  // this one (and, under --node=auto, the rank it was learned from).
  absl::Status CheckLocal(uint32_t rank) const;

 private:
  NodeRanks(uint32_t per_node, uint32_t world, bool learn)
      : per_node_(per_node), world_(world), learn_(learn) {}

  uint32_t per_node_ = 1;
  uint32_t world_ = 1;
  bool learn_ = false;        // --node=auto
  bool known_ = false;
  uint32_t node_ = 0;
  uint32_t learned_from_ = 0;  // the rank that fixed the node under --node=auto
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_WINDOW_NODE_RANKS_H_
