// Where each shard is staged when the job has locality (job.proto,
// LocalityConfig): its home nodes (common/shard_homes.h) over the job's
// nodes, from the job's seed and the index's shard names and sizes. The
// planner reads the availability for each step from it, so the encoder
// phase prefers ranks of a shard's home nodes and an item placed elsewhere
// is a remote load from a home node (ImagePlan.holder_node).
//
// Faults: the node set and the nodes' capacities are an input, a list of
// changes each in force from a step (announced ahead, as the cost fits are,
// cost_schedule.h): an operator's removal (--node_removals), or what the
// packer concluded from the stagers' reports (locality_schedule.h): a node
// gone silent is removed, one that reports again is added back, one whose
// cache is smaller than its homes gets that capacity. From a change's step
// on the homes are assigned anew over the live nodes and their capacities
// (rendezvous: a removal moves only the removed node's shards, an addition
// only the shards that move back to it, common/shard_homes.h); steps before
// it keep their homes. The same changes give the same plans, so a restarted
// packer given them plans every step as before. Immutable once created:
// thread-safe.
#ifndef TUTTI_SERVICES_PACKER_CORE_HOME_STAGING_H_
#define TUTTI_SERVICES_PACKER_CORE_HOME_STAGING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/shard_homes.h"
#include "services/packer/core/plan_data.h"
#include "services/packer/core/post_balancing/dispatch_types.h"
#include "services/packer/index/index.h"
#include "tutti/v1/job.pb.h"

namespace tutti::packer {

// Node `node` holds nothing from step `from_step` on.
struct NodeRemoval {
  uint32_t node = 0;
  uint64_t from_step = 0;
  bool operator==(const NodeRemoval& o) const { return node == o.node && from_step == o.from_step; }
};

// Parses "node@step[,node@step...]" (e.g. "5@1200,7@3000"); empty: none.
absl::StatusOr<std::vector<NodeRemoval>> ParseNodeRemovals(absl::string_view text);

// One change of the node set or of a node's capacity, from a step on.
struct LocalityChange {
  enum class Kind : uint8_t {
    kRemove,    // the node holds nothing from from_step on
    kAdd,       // a removed node is live again from from_step on
    kCapacity,  // the node holds at most capacity_bytes of shards
  };
  Kind kind = Kind::kRemove;
  uint32_t node = 0;
  uint64_t from_step = 0;
  // kCapacity: the node's cache capacity from from_step on; 0: the job's
  // locality.node_cache_bytes again.
  uint64_t capacity_bytes = 0;
  bool operator==(const LocalityChange& o) const {
    return kind == o.kind && node == o.node && from_step == o.from_step &&
           capacity_bytes == o.capacity_bytes;
  }
};
const char* LocalityChangeName(LocalityChange::Kind kind);  // "remove", "add", "capacity"
std::vector<LocalityChange> RemovalChanges(const std::vector<NodeRemoval>& removals);

class HomeStaging {
 public:
  // The homes of `index`'s shards over config.world_size / ranks_per_node
  // nodes with config.locality (home_replication must be > 0) and
  // config.seed, and one re-homing per distinct change step (changes of
  // one step apply in the order given; the order of steps is theirs).
  // Errors: INVALID_ARGUMENT for a change of a node the job does not have,
  // or one that leaves no node; RESOURCE_EXHAUSTED (ShardHomes::Assign)
  // when the nodes cannot hold home_replication copies within their
  // capacities, naming the step the changes reach it.
  static absl::StatusOr<std::shared_ptr<const HomeStaging>> Create(
      const v1::JobConfig& config, const Index& index, std::vector<LocalityChange> changes = {});

  // The availability in force at `step` (dispatch_types.h): the (shard,
  // node) pairs of the homes then.
  const dispatch::ShardAvailability& At(uint64_t step) const { return Era(step).availability; }
  const ShardHomes& HomesAt(uint64_t step) const { return Era(step).homes; }
  // The nodes excluded at `step`, increasing.
  const std::vector<uint32_t>& ExcludedAt(uint64_t step) const { return Era(step).excluded; }
  // Each node's cache capacity at `step` (0: unbounded).
  uint64_t CapacityAt(uint64_t step, uint32_t node) const;
  uint32_t nodes() const { return nodes_; }
  // The changes, by step (stable).
  const std::vector<LocalityChange>& changes() const { return changes_; }

 private:
  struct Span {
    uint64_t from_step = 0;
    std::vector<uint32_t> excluded;
    std::vector<uint64_t> capacities;  // by node, as ShardHomesOptions::node_capacities
    ShardHomes homes;
    dispatch::ShardAvailability availability;
  };
  const Span& Era(uint64_t step) const;

  std::vector<LocalityChange> changes_;  // by step (stable)
  uint32_t nodes_ = 0;
  uint64_t default_capacity_ = 0;  // locality.node_cache_bytes
  std::vector<Span> eras_;         // by from_step; eras_[0].from_step == 0
};

// What a planned step asks of the stagers with locality: the inputs it
// loads (images, audio clips, documents' token ids; a split document's
// pieces each count) and those whose shard the loading rank's node does not
// stage (remote loads, served by a holder's stager), with their member bytes
// as stored in the shards (what moves stager to stager).
struct StepLocality {
  uint64_t items = 0, remote_items = 0;
  uint64_t member_bytes = 0, remote_member_bytes = 0;
};
StepLocality MeasureStepLocality(const Index& index, const StepPlanData& step);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_HOME_STAGING_H_
