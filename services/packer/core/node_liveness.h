// Which node changes the stagers' reports call for (the policy of the
// packer's locality monitor, locality_monitor.h). Each stager reports its
// node every few seconds (Packer.ReportNode): its cache capacity, the bytes
// it holds and the shards it could not stage for want of space. From the
// reports and a clock the caller passes in:
//   - dead: a node that reported before, is live in the homes and has not
//     reported for dead_after is removed (its shards re-homed);
//   - returned: a node removed at run time (not by the operator's
//     --node_removals) that reports again is added back;
//   - capacity: a live node whose reported capacity is below the bytes the
//     homes assign it, or which refused shards for want of space (then what
//     it holds is its capacity), gets that capacity; only ever lowered, so
//     reports settle.
// The caller announces the changes (locality_schedule.h) and says which it
// could not take (Refused), so they are not proposed again for the same
// value. No I/O, no clock of its own. Not thread-safe: the caller locks.
#ifndef TUTTI_SERVICES_PACKER_CORE_NODE_LIVENESS_H_
#define TUTTI_SERVICES_PACKER_CORE_NODE_LIVENESS_H_

#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/time/time.h"
#include "services/packer/core/home_staging.h"

namespace tutti::packer {

struct NodeReport {
  uint32_t node = 0;
  uint64_t capacity_bytes = 0;  // the stager's --cache_capacity; 0 = unbounded
  uint64_t held_bytes = 0;      // bytes of shards it holds
  uint32_t refused_shards = 0;  // shards it could not stage for want of space
};

struct NodeLivenessOptions {
  // A node that reported before and not for this long is dead; zero: never.
  // Default 30 s (tutti-packerd --node_dead_after_s).
  absl::Duration dead_after = absl::Seconds(30);
};

// A change the reports call for, and why: "dead", "returned", "capacity".
struct ProposedChange {
  LocalityChange change;  // from_step unset: the announcement sets it
  std::string reason;
};

class NodeLiveness {
 public:
  // `nodes`: the job's nodes; `operator_removed`: nodes removed by the
  // operator (never added back here).
  NodeLiveness(uint32_t nodes, NodeLivenessOptions options,
               std::vector<uint32_t> operator_removed = {});

  // Notes a report of r.node (< nodes) received at `now`.
  void Report(const NodeReport& r, absl::Time now);

  // The changes due at `now` against `homes` (its latest era: the homes with
  // every change announced so far), removals and additions first.
  std::vector<ProposedChange> Due(absl::Time now, const HomeStaging& homes) const;

  // `c` could not be announced: not proposed again unless its node's
  // state moves on (another capacity, a report after a removal refused).
  void Refused(const LocalityChange& c);

  // Nodes that reported at least once / whose last report is older than
  // dead_after (dead or soon removed).
  uint32_t reporting() const;
  bool silent(uint32_t node, absl::Time now) const;
  // The last report of `node` (node 0 capacity etc. if none).
  const NodeReport& last(uint32_t node) const { return nodes_[node].report; }
  bool reported(uint32_t node) const { return nodes_[node].reported; }

 private:
  struct Node {
    bool reported = false;
    absl::Time last_at = absl::InfinitePast();
    NodeReport report;
    uint64_t reports = 0;  // counts reports, so a refusal is retried after a new one
  };
  const NodeLivenessOptions options_;
  std::vector<Node> nodes_;
  std::set<uint32_t> operator_removed_;
  // (kind, node, capacity or report count) refused.
  std::set<std::tuple<int, uint32_t, uint64_t>> refused_;
  uint64_t Key(const LocalityChange& c) const;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_NODE_LIVENESS_H_
