#include "common/shard_homes.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/rng.h"

namespace tutti {
namespace {

// FNV-1a over the name: stable across builds and machines (absl::Hash is not).
uint64_t NameHash(absl::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

uint64_t ShardSeed(uint64_t seed, absl::string_view name) {
  return Mix64(NameHash(name) ^ SplitMix64Of(seed));
}

// Highest weight first; equal weights to the lower node id.
bool Heavier(const std::pair<uint64_t, uint32_t>& a, const std::pair<uint64_t, uint32_t>& b) {
  return a.first != b.first ? a.first > b.first : a.second < b.second;
}

}  // namespace

uint64_t ShardHomeWeight(uint64_t seed, absl::string_view name, uint32_t node) {
  return MixSeed(ShardSeed(seed, name), uint64_t{node} + 1);
}

absl::StatusOr<ShardHomes> ShardHomes::Assign(absl::Span<const ShardKey> shards, uint32_t nodes,
                                              const ShardHomesOptions& options,
                                              absl::Span<const uint32_t> excluded_nodes) {
  if (options.replication == 0) {
    return absl::InvalidArgumentError(
        "shard homes: replication is 0; every shard needs at least one home node");
  }
  std::vector<bool> excluded(nodes, false);
  for (uint32_t n : excluded_nodes) {
    if (n < nodes) excluded[n] = true;
  }
  std::vector<uint32_t> live;
  live.reserve(nodes);
  for (uint32_t n = 0; n < nodes; ++n) {
    if (!excluded[n]) live.push_back(n);
  }
  if (live.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard homes: no live node among ", nodes, " (", excluded_nodes.size(),
                     " excluded); at least one node must be able to stage the dataset"));
  }
  ShardHomes h;
  h.shards_ = static_cast<uint32_t>(shards.size());
  h.nodes_ = nodes;
  h.replication_ = std::min<uint32_t>(options.replication, static_cast<uint32_t>(live.size()));
  h.homes_.resize(size_t{h.shards_} * h.replication_);
  h.node_bytes_.assign(nodes, 0);
  const uint32_t r = h.replication_;
  const uint64_t cap = options.node_capacity_bytes;
  // Each node's capacity (0 = unbounded); any unbounded live node lifts the
  // total bound.
  std::vector<uint64_t> caps(nodes, cap);
  for (uint32_t n = 0; n < nodes && n < options.node_capacities.size(); ++n) {
    if (options.node_capacities[n] > 0) caps[n] = options.node_capacities[n];
  }
  bool bounded = true;
  unsigned __int128 have = 0;
  for (uint32_t n : live) {
    bounded = bounded && caps[n] != 0;
    have += caps[n];
  }
  const bool uniform = options.node_capacities.empty();
  const std::string cap_text = uniform ? absl::StrCat("the cache capacity of ", FormatBytes(cap))
                                       : std::string("the nodes' cache capacities");

  if (bounded) {
    unsigned __int128 need = 0;
    for (const ShardKey& s : shards) need += static_cast<unsigned __int128>(s.bytes) * r;
    if (need > have) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "shard homes: ", r, " copies of the dataset need ",
          FormatBytes(static_cast<uint64_t>(std::min<unsigned __int128>(need, UINT64_MAX))),
          " but ", live.size(), " live nodes",
          uniform ? absl::StrCat(" of ", FormatBytes(cap), " each") : std::string(), " hold ",
          FormatBytes(static_cast<uint64_t>(std::min<unsigned __int128>(have, UINT64_MAX))),
          "; raise the per-node cache capacity, lower the replication or add nodes"));
    }
  }

  std::vector<std::pair<uint64_t, uint32_t>> w(live.size());
  for (uint32_t s = 0; s < h.shards_; ++s) {
    const ShardKey& key = shards[s];
    if (uniform && cap != 0 && key.bytes > cap) {
      return absl::ResourceExhaustedError(
          absl::StrCat("shard homes: shard ", key.name, " (", FormatBytes(key.bytes),
                       ") is larger than a node's cache capacity of ", FormatBytes(cap),
                       "; raise the per-node cache capacity or split the shard"));
    }
    const uint64_t shard_seed = ShardSeed(options.seed, key.name);
    for (size_t i = 0; i < live.size(); ++i) {
      w[i] = {MixSeed(shard_seed, uint64_t{live[i]} + 1), live[i]};
    }
    auto fits = [&](uint32_t n) { return caps[n] == 0 || h.node_bytes_[n] + key.bytes <= caps[n]; };
    // The r heaviest first; only when one of them is full is the rest ordered.
    std::partial_sort(w.begin(), w.begin() + r, w.end(), Heavier);
    bool all_fit = true;
    for (uint32_t j = 0; j < r; ++j) all_fit = all_fit && fits(w[j].second);
    if (!all_fit) std::sort(w.begin() + r, w.end(), Heavier);
    uint32_t* out = h.homes_.data() + size_t{s} * r;
    uint32_t got = 0;
    for (size_t i = 0; i < w.size() && got < r; ++i) {
      if (!fits(w[i].second)) continue;
      out[got++] = w[i].second;
      h.node_bytes_[w[i].second] += key.bytes;
    }
    if (got < r) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "shard homes: shard ", s, " (", key.name, ", ", FormatBytes(key.bytes), ") finds ", got,
          " of ", r, " live nodes with room under ", cap_text,
          " once the shards before it are placed; raise the per-node cache capacity, lower the "
          "replication or add nodes"));
    }
  }
  return h;
}

bool ShardHomes::IsHome(uint32_t shard, uint32_t node) const {
  if (shard >= shards_) return false;
  for (uint32_t n : Homes(shard)) {
    if (n == node) return true;
  }
  return false;
}

std::vector<uint32_t> ShardHomes::ShardsOf(uint32_t node) const {
  std::vector<uint32_t> out;
  for (uint32_t s = 0; s < shards_; ++s) {
    if (IsHome(s, node)) out.push_back(s);
  }
  return out;
}

}  // namespace tutti
