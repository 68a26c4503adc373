#include "services/packer/core/node_liveness.h"

#include <algorithm>
#include <limits>

namespace tutti::packer {

NodeLiveness::NodeLiveness(uint32_t nodes, NodeLivenessOptions options,
                           std::vector<uint32_t> operator_removed)
    : options_(options),
      nodes_(nodes),
      operator_removed_(operator_removed.begin(), operator_removed.end()) {}

void NodeLiveness::Report(const NodeReport& r, absl::Time now) {
  if (r.node >= nodes_.size()) return;
  Node& n = nodes_[r.node];
  n.reported = true;
  n.last_at = std::max(n.last_at, now);
  n.report = r;
  ++n.reports;
}

bool NodeLiveness::silent(uint32_t node, absl::Time now) const {
  const Node& n = nodes_[node];
  return n.reported && options_.dead_after > absl::ZeroDuration() &&
         now - n.last_at > options_.dead_after;
}

uint32_t NodeLiveness::reporting() const {
  uint32_t k = 0;
  for (const Node& n : nodes_) k += n.reported;
  return k;
}

uint64_t NodeLiveness::Key(const LocalityChange& c) const {
  // A capacity is refused for its value; a removal or an addition until the
  // node reports again.
  return c.kind == LocalityChange::Kind::kCapacity ? c.capacity_bytes : nodes_[c.node].reports;
}

void NodeLiveness::Refused(const LocalityChange& c) {
  if (c.node >= nodes_.size()) return;
  refused_.insert({static_cast<int>(c.kind), c.node, Key(c)});
}

std::vector<ProposedChange> NodeLiveness::Due(absl::Time now, const HomeStaging& homes) const {
  constexpr uint64_t kLatest = std::numeric_limits<uint64_t>::max();
  const std::vector<uint32_t>& excluded = homes.ExcludedAt(kLatest);
  const ShardHomes& latest = homes.HomesAt(kLatest);
  std::vector<ProposedChange> out, capacity;
  auto propose = [&](std::vector<ProposedChange>* to, LocalityChange c, const char* reason) {
    if (refused_.count({static_cast<int>(c.kind), c.node, Key(c)})) return;
    to->push_back({c, reason});
  };
  for (uint32_t node = 0; node < nodes_.size(); ++node) {
    const Node& n = nodes_[node];
    if (!n.reported) continue;
    const bool live = !std::binary_search(excluded.begin(), excluded.end(), node);
    const bool is_silent = silent(node, now);
    if (live && is_silent) {
      propose(&out, {LocalityChange::Kind::kRemove, node, 0, 0}, "dead");
      continue;
    }
    if (!live && !is_silent && !operator_removed_.count(node)) {
      propose(&out, {LocalityChange::Kind::kAdd, node, 0, 0}, "returned");
      continue;
    }
    if (!live) continue;
    // What the node can hold: its capacity, or what it held when it refused
    // shards for want of space.
    uint64_t can_hold = n.report.capacity_bytes;
    if (n.report.refused_shards > 0 && n.report.held_bytes > 0) {
      can_hold = can_hold == 0 ? n.report.held_bytes : std::min(can_hold, n.report.held_bytes);
    }
    if (can_hold == 0) continue;  // unbounded, or nothing held to go by
    const uint64_t in_force = homes.CapacityAt(kLatest, node);
    if ((in_force == 0 || can_hold < in_force) && latest.BytesOf(node) > can_hold) {
      propose(&capacity, {LocalityChange::Kind::kCapacity, node, 0, can_hold}, "capacity");
    }
  }
  out.insert(out.end(), capacity.begin(), capacity.end());
  return out;
}

}  // namespace tutti::packer
