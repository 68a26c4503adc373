// The core of `tutti bench locality`: what shard homes (job config
// locality) save at cluster scale. A synthetic dataset in the seed's mix
// (bench_workload.h) cut into as many shards as the dataset has (e.g. 10 TB
// in 1 GB shards: 10,000), steps of the seed workload at world size W
// planned by the packer's own Job and Planner with post-balancing, with
// locality and without it (today: every shard counts as staged on every
// node), and from those plans:
//   - NFS egress per epoch. With locality each shard is staged by its home
//     nodes' stagers and by no other (a remote input comes from a holder's
//     stager), so the source is read r x dataset per epoch by construction:
//     the bench sums the bytes the homes hold and checks that no plan loads
//     an input locally on a node that is not its shard's home. Today each
//     node stages every shard its ranks' plans name; the bench measures the
//     distinct shards each node's plans name per step and models an epoch
//     of such steps against a cache of the given size under uniform access
//     (a shard touched is in the cache with probability cached / shards:
//     whatever the eviction policy, with uniformly random access).
//   - The ViT phase's slowest rank over its lower bound, with and without
//     locality; the member bytes moved stager to stager per step (remote
//     inputs, as stored in the shards); the share of inputs remote.
//   - The median plan time (one thread's CPU time and wall clock).
// No I/O: progress goes through a callback.
#ifndef TUTTI_SERVICES_PACKER_BENCH_LOCALITY_BENCH_H_
#define TUTTI_SERVICES_PACKER_BENCH_LOCALITY_BENCH_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/packer/bench/bench_workload.h"

namespace tutti::packer {

struct LocalityBenchOptions {
  uint32_t world_size = 2560;
  SeedWorkloadOptions workload;  // ranks_per_node 8 by default
  uint64_t max_pixels = kSeedStage1MaxPixels;
  uint64_t dataset_bytes = 10'000'000'000'000;  // 10 TB
  uint64_t shard_bytes = 1'000'000'000;         // 1 GB
  uint32_t replication = 1;                     // locality.home_replication
  // Each node's cache as a fraction of the dataset.
  std::vector<double> cache_fractions = {1.0 / 32, 1.0 / 8, 1.0};
  uint32_t steps = 3;  // steps planned and measured (from step 0)
  // Synthetic samples in the index; 0: the planned steps' draws and one more.
  uint64_t samples = 0;
  double balance_tolerance = -1;  // post_balancing.balance_tolerance; < 0: default
  std::function<void(const std::string&)> progress;  // may be empty
};

struct LocalityBenchRow {
  double cache_fraction = 0;
  double cache_bytes_per_node = 0;
  double limit_bytes = 0;         // r x dataset
  double nfs_today_bytes = 0;     // per epoch, modelled from the plans' shard touches
  double nfs_locality_bytes = 0;  // per epoch: what the homes hold
  std::string error;  // the caches cannot hold r copies: locality refused (job refused at load)
};

struct LocalityBenchResult {
  uint32_t ranks = 0, nodes = 0, shards = 0, replication = 0;
  uint64_t samples_per_step = 0, index_samples = 0;
  double epoch_steps = 0;               // dataset samples / samples per step
  double shards_per_node_step = 0;      // today: distinct shards a node's plans name, per step
  double vit_over_bound = 0;            // with locality, mean over the steps
  double vit_over_bound_today = 0;      // without
  double remote_share = 0;              // inputs remote with locality
  double image_remote_share = 0;        // of the images, with locality
  double peer_bytes_per_step = 0;       // member bytes sent stager to stager, per step
  uint64_t off_home_local_loads = 0;    // inputs loaded locally on a non-home node (must be 0)
  double plan_cpu_ms = 0, plan_ms = 0;  // median, with locality
  double plan_cpu_ms_today = 0, plan_ms_today = 0;  // median, without
  std::vector<LocalityBenchRow> rows;
};

absl::StatusOr<LocalityBenchResult> RunLocalityBench(const LocalityBenchOptions& options);
std::string FormatLocalityTable(const LocalityBenchResult& result);
std::string FormatLocalityJson(const LocalityBenchResult& result);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_BENCH_LOCALITY_BENCH_H_
