// `tutti simulate --ladder`, `--fit-experiment` and `--egress`: the
// flags as given, turned into a setup (model, cluster, workload, timing) and
// run; prints a table, JSON, or draws a PNG. tools/simulate_cmd.cc parses
// the flags.
#ifndef TUTTI_TOOLS_SIM_SIMULATE_MAIN_H_
#define TUTTI_TOOLS_SIM_SIMULATE_MAIN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "tools/sim/ladder.h"

namespace tutti::sim {

struct SimulateFlags {
  bool ladder = false;
  bool fit_experiment = false;
  bool egress = false;
  std::string model = "vit400m-moe16b-a3b";
  std::string cluster = "b200";
  std::string sync = "both";  // allreduce, fsdp or both
  std::string attention = "flash";
  std::string world_sizes = "8,64";
  std::string stages = "1003520,16777216";
  std::string rungs;     // ids, comma-separated; empty: all
  std::string index;     // a workload index; empty: the seed workload
  uint64_t samples = 0;  // seed workload size; 0: enough for two steps at the largest world
  double audio_fraction = 0;
  uint64_t from = 0;
  uint64_t steps = 0;       // 0: 10 for the ladder, 200 for the fit experiment
  std::string calibration;  // pairs file (calibration.h)
  // Cluster and data-path overrides ("" = the preset's).
  std::string peak_flops, util_vit, util_llm, util_attention, nvlink_bandwidth, network_bandwidth,
      decode_threads, prefetch_window;
  double off_by = 4;
  // --egress: the cluster (world size nodes x ranks_per_node), the dataset,
  // each node's cache sizes (nfs_egress.h: ParseCacheSizes) and the homes.
  uint32_t nodes = 320;
  uint32_t ranks_per_node = 8;
  std::string dataset_bytes = "10000000000000";  // 10 TB
  std::string shard_bytes = "1000000000";        // 1 GB
  std::string caches = "1/32,1/8,1";
  uint32_t replication = 1;
  bool json = false;
  std::string plot;
};

// The setup the flags describe (for `world_size` ranks at most: the seed
// workload is sized for it), or an error naming the flag.
absl::StatusOr<SimSetup> SetupFromFlags(const SimulateFlags& flags, uint32_t max_world_size);

// `tutti simulate --egress`: NFS egress per epoch with and without shard
// homes (services/packer/bench/nfs_egress.h); the exit code as below.
int RunSimulateEgress(const SimulateFlags& flags);

// Runs what the flags ask for; the exit code (0, 1 on failure after
// printing why to stderr, 2 for a usage error).
int RunSimulateModels(const SimulateFlags& flags);

}  // namespace tutti::sim

#endif  // TUTTI_TOOLS_SIM_SIMULATE_MAIN_H_
