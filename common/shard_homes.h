// Home nodes of every shard: the nodes whose stagers stage it, chosen by
// rendezvous (highest-random-weight) hashing.
//
// Each (shard, node) pair has a weight, a 64-bit hash of the seed (the
// job's), the shard's key and the node id; a shard's homes are the
// `replication` live nodes of highest weight, best first. The key is the
// shard's name as the index holds it (relative to the source directory:
// JobInfo.shards, ShardRef.name), which the packer and every stager see
// alike; a shard's index position is not part of it, so reordering or
// extending the index moves no shard. The weight of a pair does not depend on
// the other nodes, hence:
//   - adding node n to nodes 0..n-1 moves exactly the shards for which n
//     outweighs a current home (about r/(n+1) of them), each onto n;
//   - excluding a node (dead, removed) moves only the shards it was home to:
//     they keep their other homes and gain the next-highest live node.
// With a per-node capacity (one for all, or each node its own), shards are assigned in the order
// given (index order): a node whose assigned bytes plus the shard's would exceed the capacity is
// passed over and the next-highest weight takes the shard. The movement bounds above then hold only
// while no node is full.
//
// Pure and deterministic: the same shards, node count, options and excluded
// set give the same homes on every machine.
#ifndef TUTTI_COMMON_SHARD_HOMES_H_
#define TUTTI_COMMON_SHARD_HOMES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tutti {

struct ShardHomesOptions {
  // Homes per shard (>= 1); capped at the number of live nodes.
  uint32_t replication = 1;
  // Bytes of shards one node may be home to; 0 = unbounded.
  uint64_t node_capacity_bytes = 0;
  // Per node id, that node's own capacity where > 0 (what its stager
  // reports), in place of node_capacity_bytes; nodes beyond the vector and
  // entries of 0 have node_capacity_bytes. Default empty.
  std::vector<uint64_t> node_capacities;
  // The job's seed: another seed gives an independent assignment.
  uint64_t seed = 0;
};

struct ShardKey {
  std::string name;    // the shard's name as the index holds it
  uint64_t bytes = 0;  // its size (counted against node_capacity_bytes)
};

// The weight of node `node` for a shard whose name is `name` under `seed`:
// the homes are the live nodes of highest weight (ties to the lower id).
uint64_t ShardHomeWeight(uint64_t seed, absl::string_view name, uint32_t node);

class ShardHomes {
 public:
  // Assigns homes to `shards` over nodes 0..nodes-1 less `excluded_nodes`
  // (ids >= nodes are ignored). INVALID_ARGUMENT: replication 0, no live
  // node. RESOURCE_EXHAUSTED: the live nodes cannot hold
  // min(replication, live nodes) copies of every shard within
  // node_capacity_bytes (a shard larger than the capacity, too little
  // capacity in total, or too little left once earlier shards were placed);
  // the message names the shard, the bytes needed and held, and the fix.
  static absl::StatusOr<ShardHomes> Assign(absl::Span<const ShardKey> shards, uint32_t nodes,
                                           const ShardHomesOptions& options,
                                           absl::Span<const uint32_t> excluded_nodes = {});

  ShardHomes() = default;

  uint32_t shards() const { return shards_; }
  uint32_t nodes() const { return nodes_; }
  // Homes per shard: min(options.replication, live nodes).
  uint32_t replication() const { return replication_; }

  // The homes of `shard` (< shards()), best first.
  absl::Span<const uint32_t> Homes(uint32_t shard) const {
    return absl::MakeConstSpan(homes_.data() + size_t{shard} * replication_, replication_);
  }
  bool IsHome(uint32_t shard, uint32_t node) const;
  // The shards `node` is home to, ascending.
  std::vector<uint32_t> ShardsOf(uint32_t node) const;
  // Bytes of the shards `node` is home to; 0 for an excluded or unknown node.
  uint64_t BytesOf(uint32_t node) const { return node < nodes_ ? node_bytes_[node] : 0; }

 private:
  uint32_t shards_ = 0, nodes_ = 0, replication_ = 0;
  std::vector<uint32_t> homes_;       // shards_ x replication_, row-major
  std::vector<uint64_t> node_bytes_;  // by node id
};

}  // namespace tutti

#endif  // TUTTI_COMMON_SHARD_HOMES_H_
