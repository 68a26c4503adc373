#include "services/packer/core/home_staging.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace tutti::packer {

absl::StatusOr<std::vector<NodeRemoval>> ParseNodeRemovals(absl::string_view text) {
  std::vector<NodeRemoval> out;
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(part, '@');
    NodeRemoval r;
    if (!absl::SimpleAtoi(kv.first, &r.node) || !absl::SimpleAtoi(kv.second, &r.from_step)) {
      return absl::InvalidArgumentError(
          absl::StrCat("node removal '", part,
                       "' is not node@step (e.g. 5@1200: node 5 holds nothing from step 1200 on)"));
    }
    out.push_back(r);
  }
  return out;
}

const char* LocalityChangeName(LocalityChange::Kind kind) {
  switch (kind) {
    case LocalityChange::Kind::kRemove:
      return "remove";
    case LocalityChange::Kind::kAdd:
      return "add";
    case LocalityChange::Kind::kCapacity:
      return "capacity";
  }
  return "?";
}

std::vector<LocalityChange> RemovalChanges(const std::vector<NodeRemoval>& removals) {
  std::vector<LocalityChange> out;
  for (const NodeRemoval& r : removals) {
    out.push_back({LocalityChange::Kind::kRemove, r.node, r.from_step, 0});
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const HomeStaging>> HomeStaging::Create(
    const v1::JobConfig& config, const Index& index, std::vector<LocalityChange> changes) {
  const v1::LocalityConfig& l = config.locality();
  if (l.home_replication() == 0) {
    return absl::InvalidArgumentError(
        "shard homes need locality.home_replication >= 1 (the job has locality off)");
  }
  const uint32_t nodes = config.world_size() / std::max<uint32_t>(config.ranks_per_node(), 1);
  std::stable_sort(
      changes.begin(), changes.end(),
      [](const LocalityChange& a, const LocalityChange& b) { return a.from_step < b.from_step; });
  for (const LocalityChange& c : changes) {
    if (c.node >= nodes) {
      return absl::InvalidArgumentError(
          absl::StrCat("node ", LocalityChangeName(c.kind), " ", c.node, "@", c.from_step,
                       " names no node of the job (nodes 0..", nodes - 1, ")"));
    }
  }
  std::vector<ShardKey> keys;
  keys.reserve(index.num_shards());
  for (const IndexShard& s : index.shards()) keys.push_back({s.name, s.size});
  ShardHomesOptions o;
  o.replication = l.home_replication();
  o.node_capacity_bytes = l.node_cache_bytes();
  o.seed = config.seed();

  auto staging = std::shared_ptr<HomeStaging>(new HomeStaging());
  staging->changes_ = changes;
  staging->nodes_ = nodes;
  staging->default_capacity_ = l.node_cache_bytes();
  std::vector<bool> excluded(nodes, false);
  std::vector<uint64_t> capacities;  // empty while no node has its own
  size_t next = 0;
  uint64_t from = 0;
  while (true) {
    Span era;
    era.from_step = from;
    for (uint32_t n = 0; n < nodes; ++n) {
      if (excluded[n]) era.excluded.push_back(n);
    }
    era.capacities = capacities;
    o.node_capacities = capacities;
    absl::StatusOr<ShardHomes> homes = ShardHomes::Assign(keys, nodes, o, era.excluded);
    if (!homes.ok()) {
      return Annotate(homes.status(),
                      from == 0 ? std::string("locality")
                                : absl::StrCat("locality from step ", from, ", with nodes {",
                                               absl::StrJoin(era.excluded, ","), "} removed"));
    }
    era.homes = *std::move(homes);
    era.availability = dispatch::ShardAvailability::None(index.num_shards(), nodes);
    for (uint32_t s = 0; s < index.num_shards(); ++s) {
      for (uint32_t n : era.homes.Homes(s)) era.availability.Set(s, n, true);
    }
    staging->eras_.push_back(std::move(era));
    if (next == changes.size()) break;
    from = changes[next].from_step;
    while (next < changes.size() && changes[next].from_step == from) {
      const LocalityChange& c = changes[next++];
      switch (c.kind) {
        case LocalityChange::Kind::kRemove:
          excluded[c.node] = true;
          break;
        case LocalityChange::Kind::kAdd:
          excluded[c.node] = false;
          break;
        case LocalityChange::Kind::kCapacity:
          if (capacities.empty()) capacities.assign(nodes, 0);
          capacities[c.node] = c.capacity_bytes;
          break;
      }
    }
    if (staging->eras_.back().from_step == from) staging->eras_.pop_back();  // changes at step 0
  }
  return std::shared_ptr<const HomeStaging>(std::move(staging));
}

uint64_t HomeStaging::CapacityAt(uint64_t step, uint32_t node) const {
  const Span& e = Era(step);
  if (node < e.capacities.size() && e.capacities[node] > 0) return e.capacities[node];
  return default_capacity_;
}

const HomeStaging::Span& HomeStaging::Era(uint64_t step) const {
  auto it = std::upper_bound(eras_.begin(), eras_.end(), step,
                             [](uint64_t s, const Span& e) { return s < e.from_step; });
  return *(it - 1);
}

StepLocality MeasureStepLocality(const Index& index, const StepPlanData& step) {
  StepLocality out;
  auto add = [&out](bool remote, uint64_t bytes) {
    ++out.items;
    out.member_bytes += bytes;
    if (remote) {
      ++out.remote_items;
      out.remote_member_bytes += bytes;
    }
  };
  for (const PlannedSample& ps : step.samples) add(ps.text_remote, index.text_size(ps.sample));
  for (const PlannedImage& im : step.images) add(im.remote_load, index.media(im.media).size);
  for (const PlannedAudio& au : step.audio) add(au.remote_load, index.media(au.media).size);
  return out;
}

}  // namespace tutti::packer
