// The core of `tutti bench locality`: what shard homes (job config
// locality) save at cluster scale. The seed workload at world size W over a
// synthetic dataset cut into the dataset's shards (nfs_egress.h), planned by
// the packer's own Job and Planner with post-balancing, with locality and
// without it (today: every shard counts as staged on every node), and from
// those plans:
//   - NFS egress per epoch, counted (nfs_egress.h): every node's stager an
//     LRU cache of each given size over the shards its plans name in plan
//     order, for an epoch of planned steps; and a check that no plan loads
//     an input locally on a node that is not its shard's home.
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
#include "services/packer/bench/nfs_egress.h"

namespace tutti::packer {

// The egress options (count_steps 0: an epoch) and the steps measured.
struct LocalityBenchOptions : EgressOptions {
  uint32_t steps = 3;  // steps planned and measured (from step 0)
};

struct LocalityBenchResult {
  EgressResult egress;
  double vit_over_bound = 0;            // with locality, mean over the steps
  double vit_over_bound_today = 0;      // without
  double remote_share = 0;              // inputs remote with locality
  double image_remote_share = 0;        // of the images, with locality
  double peer_bytes_per_step = 0;       // member bytes sent stager to stager, per step
  uint64_t off_home_local_loads = 0;    // inputs loaded locally on a non-home node (must be 0)
  double plan_cpu_ms = 0, plan_ms = 0;  // median, with locality
  double plan_cpu_ms_today = 0, plan_ms_today = 0;  // median, without
};

absl::StatusOr<LocalityBenchResult> RunLocalityBench(const LocalityBenchOptions& options);
std::string FormatLocalityTable(const LocalityBenchResult& result);
std::string FormatLocalityJson(const LocalityBenchResult& result);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_BENCH_LOCALITY_BENCH_H_
