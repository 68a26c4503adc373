// NFS egress per epoch, counted from the packer's own plans: what `tutti
// simulate --egress` and `tutti bench locality` report (one model, here).
//
// A synthetic dataset in the seed's mix (bench_workload.h) cut into as many
// shards as the dataset has (e.g. 10 TB in 1 GB shards: 10,000), steps of
// the seed workload at world size W planned with post-balancing by the
// packer's Job and Planner, once without locality (today) and once with
// shard homes (job config locality, r homes per shard). Every node's stager
// is then simulated as a cache of the given size that evicts the least
// recently used shard, fed in plan order with the shards the node reads in
// each step (StepShardReads); every miss is a shard read from the source.
//   - Today every shard counts as staged on every node: a node reads every
//     shard its ranks' plans name.
//   - With homes a node reads the shards it loads locally (its homes) and
//     those it serves to other nodes as the holder of a remote load.
// Counted: the plans, the order, the cache's hits and misses. Modelled: the
// synthetic index holds fewer samples per shard than the dataset (its
// epochs repeat, reshuffled, to fill the dataset's epoch of steps) and its
// shard bytes are scaled to the dataset's; a stager reads a whole shard on
// a miss and reads a shard once for all the members a step needs from it.
#ifndef TUTTI_SERVICES_PACKER_BENCH_NFS_EGRESS_H_
#define TUTTI_SERVICES_PACKER_BENCH_NFS_EGRESS_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/shard_homes.h"
#include "services/packer/bench/bench_workload.h"
#include "services/packer/core/job.h"
#include "services/packer/core/plan_data.h"

namespace tutti::packer {

// The shards one stager holds, within `capacity_bytes`: a touched shard not
// held is read (from the source) and the least recently used shards are
// evicted until it fits; a shard larger than the capacity is read and not
// kept.
class LruShardCache {
 public:
  explicit LruShardCache(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}
  // true: held (a hit); false: read.
  bool Touch(uint32_t shard, uint64_t bytes);
  uint64_t read_bytes() const { return read_bytes_; }
  uint64_t reads() const { return reads_; }
  uint64_t held_bytes() const { return held_; }

 private:
  uint64_t capacity_ = 0, held_ = 0, read_bytes_ = 0, reads_ = 0;
  std::list<std::pair<uint32_t, uint64_t>> order_;  // most recently used first
  absl::flat_hash_map<uint32_t, std::list<std::pair<uint32_t, uint64_t>>::iterator> where_;
};

// The shards each node's stager reads in a planned step, in plan order
// (load items: the images, the audio clips, then the samples' text), each
// shard once a step. A load item is read on its destination rank's node,
// a remote load on its holder's (load_source's) node. `per_node` is resized
// to `nodes`; an item on a node >= `nodes` is an error.
absl::Status StepShardReads(const StepPlanData& step, uint32_t ranks_per_node, uint32_t nodes,
                            std::vector<std::vector<uint32_t>>* per_node);

// Every node's stager over the steps added, with a cache of each given size.
class EgressCounter {
 public:
  EgressCounter(std::vector<uint64_t> shard_bytes, uint32_t nodes, uint32_t ranks_per_node,
                const std::vector<uint64_t>& cache_bytes);
  absl::Status AddStep(const StepPlanData& step);
  uint64_t steps() const { return steps_; }
  // Bytes read from the source, summed over the nodes, per cache size.
  std::vector<uint64_t> source_bytes() const;
  // Distinct shards a node reads a step, on average over nodes and steps.
  double shards_per_node_step() const;

 private:
  std::vector<uint64_t> shard_bytes_;
  uint32_t nodes_ = 0, rpn_ = 0;
  size_t caches_ = 0;
  std::vector<LruShardCache> lru_;  // nodes x caches, row-major
  uint64_t steps_ = 0, reads_ = 0;
  std::vector<std::vector<uint32_t>> scratch_;
};

struct EgressOptions {
  uint32_t world_size = 2560;
  SeedWorkloadOptions workload;  // ranks_per_node 8 by default
  uint64_t max_pixels = kSeedStage1MaxPixels;
  uint64_t dataset_bytes = 10'000'000'000'000;  // 10 TB
  uint64_t shard_bytes = 1'000'000'000;         // 1 GB
  uint32_t replication = 1;                     // locality.home_replication
  // Each node's cache as a fraction of the dataset, each in (0, 1].
  std::vector<double> cache_fractions = {1.0 / 32, 1.0 / 8, 1.0};
  // Steps the caches are simulated over; 0: an epoch of the dataset
  // (dataset samples / samples a step, rounded up).
  uint64_t count_steps = 0;
  // Synthetic samples in the index; 0: five steps' draws (the epochs repeat).
  uint64_t samples = 0;
  double balance_tolerance = -1;  // post_balancing.balance_tolerance; < 0: default
  std::function<void(const std::string&)> progress;  // may be empty
};

// Cache sizes as users write them: fractions of the dataset ("1/32",
// "0.125", "1") or sizes with a unit ("312G", binary multiples),
// comma-separated; returned as fractions of `dataset_bytes`. A cache larger
// than the dataset, zero, NaN or a bare number above 1 is refused.
absl::StatusOr<std::vector<double>> ParseCacheSizes(absl::string_view text, uint64_t dataset_bytes);

// What the options describe, checked: the index, the two jobs.
struct EgressSetup {
  std::shared_ptr<const Index> index;
  SeedStepShape shape;
  uint32_t world_size = 0, ranks_per_node = 0, nodes = 0, shards = 0;
  double index_bytes = 0;            // the synthetic index's shards' bytes
  double epoch_steps = 0;            // dataset samples / samples a step
  std::shared_ptr<const Job> today;  // post-balancing, no locality
  std::shared_ptr<const Job> local;  // with homes, capacity the smallest cache that holds them
  // Per cache fraction: the homes, or why r copies do not fit.
  std::vector<absl::StatusOr<ShardHomes>> homes;
};
absl::StatusOr<EgressSetup> MakeEgressSetup(const EgressOptions& options);

struct EgressRow {
  double cache_fraction = 0;
  double cache_bytes_per_node = 0;
  double limit_bytes = 0;         // r x dataset
  double nfs_today_bytes = 0;     // counted: every node stages what its plans name
  double nfs_locality_bytes = 0;  // counted: with homes
  std::string error;  // the caches cannot hold r copies: locality refused (job refused at load)
};

struct EgressResult {
  uint32_t ranks = 0, nodes = 0, shards = 0, replication = 0;
  uint64_t samples_per_step = 0, index_samples = 0;
  double epoch_steps = 0;
  uint64_t counted_steps = 0;       // steps the caches were simulated over
  double shards_per_node_step = 0;  // today: distinct shards a node reads a step
  double shards_per_node_step_locality = 0;
  std::vector<EgressRow> rows;
};

// Plans the counted steps with both jobs and runs every node's caches.
absl::StatusOr<EgressResult> CountEgress(const EgressSetup& setup, const EgressOptions& options);

// The egress table's lines (what is counted, then a row per cache size) and
// the JSON object's fields (no braces), shared by both commands.
std::string FormatEgressTable(const EgressResult& result);
std::string FormatEgressJsonFields(const EgressResult& result);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_BENCH_NFS_EGRESS_H_
