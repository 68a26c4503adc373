// A staging map for benchmarks and tests: shard s is staged on nodes s,
// s+1, ..., s+k-1 (mod the node count), the same for every step.
#ifndef TUTTI_SERVICES_PACKER_BENCH_STAGING_H_
#define TUTTI_SERVICES_PACKER_BENCH_STAGING_H_

#include <algorithm>
#include <cstdint>

#include "services/packer/core/planner.h"

namespace tutti::packer {

class ShardsOnNodes final : public ShardStaging {
 public:
  // k = 1: every shard on one node (s % nodes).
  ShardsOnNodes(uint32_t shards, uint32_t nodes, uint32_t k = 1)
      : shards_(shards), nodes_(nodes), k_(std::min(std::max<uint32_t>(k, 1), nodes)) {}
  dispatch::ShardAvailability At(uint64_t) const override {
    auto a = dispatch::ShardAvailability::None(shards_, nodes_);
    for (uint32_t s = 0; s < shards_; ++s) {
      for (uint32_t j = 0; j < k_; ++j) a.Set(s, (s + j) % nodes_, true);
    }
    return a;
  }

 private:
  uint32_t shards_, nodes_, k_;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_BENCH_STAGING_H_
