// The core of `tutti bench exchange`: per world size, one step of the seed
// workload (bench_workload.h) planned through the packer's own Job and
// Planner, exactly as tutti-packerd plans it, three ways: the drawn
// round-robin split (`none`, the post plan's imbalance_before), the
// colocated plan of a packing strategy (`pre`) and post-balancing (`post`);
// the inter-node bytes of the node-aware plan against a node-oblivious plan
// of the same balance, the fast rearrangement's gap to the GLPK optimum (on
// a sub-instance) and the plan time. No I/O: progress goes through a
// callback.
#ifndef TUTTI_SERVICES_PACKER_BENCH_EXCHANGE_BENCH_H_
#define TUTTI_SERVICES_PACKER_BENCH_EXCHANGE_BENCH_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/packer/bench/bench_workload.h"
#include "services/packer/core/job.h"
#include "services/packer/core/plan_data.h"

namespace tutti::packer {

// ---- transports ----
// `tutti bench exchange --transport NAME` runs every post plan's forward
// exchange over a real transport (the client library's MPI_Alltoallv
// Exchange under mpirun: tools/exchange_mpi_bench.h) and compares the
// client's throughput with a bare all-to-all of the same bytes. This library
// only calls the function it is given, with the job and the planned step.
struct TransportBenchResult {
  double client_gbps = 0;
  double bare_gbps = 0;
  double client_vs_bare_throughput = 0;  // client_gbps / bare_gbps; target >= 0.95
  double client_seconds = 0;             // median time of one exchange, slowest rank
  double bare_seconds = 0;
  uint64_t bytes_per_rank_max = 0;  // the largest send buffer of a rank
};
using TransportBenchFn =
    std::function<absl::StatusOr<TransportBenchResult>(const Job& job, const StepPlanData& plan)>;

struct ExchangeBenchOptions {
  std::vector<uint32_t> world_sizes = {16, 256, 2560};
  SeedWorkloadOptions workload;                // seq_len, sequences per rank, fill, ranks per node
  uint64_t max_pixels = kSeedStage1MaxPixels;  // the curriculum stage
  uint64_t samples = 0;  // dataset size; 0: two steps of the largest world, at least 50,000
  uint64_t step = 0;     // the step planned
  // Nodes whose stager has each shard: 0 (default) every node; k > 0: shard
  // s on nodes s, s+1, ..., s+k-1 (mod the node count).
  uint32_t shard_nodes = 0;
  bool padded = false;       // post_balancing.padded
  uint32_t hidden_size = 0;  // post_balancing.hidden_size; 0: the default 4096
  // post_balancing.balance_tolerance; negative (default): the job's default.
  double balance_tolerance = -1;
  std::string pre_strategy = "tutti";  // the `pre` mode's packing strategy
  uint32_t open_bins = 6;              // its N (seed strategies)
  uint32_t plan_repeats = 5;           // Planner::Plan calls timed per world size (median)
  // GLPK runs on a sub-instance of rows with world_size <= glpk_max_world:
  // the samples drawn by the first glpk_sub_ranks_per_node ranks of the first
  // glpk_sub_nodes nodes (with restricted staging, those whose shard one of
  // these nodes stages), planned on a cluster of that shape. Defaults: 16,
  // 2 nodes x 2 ranks, 30 s.
  uint32_t glpk_max_world = 16;
  uint32_t glpk_sub_nodes = 2;
  uint32_t glpk_sub_ranks_per_node = 2;
  double glpk_time_limit_s = 30;
  // When set, every post plan's exchange also runs over this transport and
  // the row reports client_vs_bare_throughput. Collective under MPI: every
  // rank runs the benchmark with the same options.
  const TransportBenchFn* transport = nullptr;
  std::function<void(const std::string&)> progress;  // may be empty
};

struct ExchangeBenchRow {
  std::string mode;  // "none", "pre", "post"
  uint32_t ranks = 0;
  uint32_t nodes = 0;
  uint32_t samples = 0;
  uint32_t vl_samples = 0;
  uint32_t images = 0;
  uint32_t audio_clips = 0;
  double encoder_imbalance = 1;  // vision phase, max / mean
  double encoder_vs_bound = 1;   // vision phase, max / lower bound
  std::optional<double> audio_imbalance;
  std::optional<double> audio_vs_bound;
  double llm_imbalance = 1;
  double llm_vs_bound = 1;
  uint64_t inter_node_bytes = 0;  // forward exchange + remote loads
  uint64_t inter_node_bytes_oblivious = 0;
  uint64_t exchange_bytes = 0;  // all forward bytes that leave a rank
  // Sub-instance: (fast - optimum) / optimum inter-node bytes of the LLM
  // rearrangement; when the optimum is 0, (fast - 0) / the node-oblivious
  // placement's bytes. Unset when GLPK did not finish or was not run.
  std::optional<double> glpk_gap;
  std::optional<uint64_t> glpk_optimum_bytes;
  std::optional<uint64_t> glpk_fast_bytes;
  std::string glpk_status;                          // "optimal", "no result: ...", "not run"
  std::optional<double> plan_ms_median;             // wall clock of one Dispatch call
  std::optional<double> plan_cpu_ms_median;         // CPU time of the planning thread
  std::optional<double> client_vs_bare_throughput;  // with a transport
  std::optional<double> client_exchange_ms;         // with a transport: median, slowest rank
  std::optional<double> bare_exchange_ms;
  std::optional<uint64_t> exchange_bytes_per_rank;  // with a transport: largest send buffer
  bool llm_fallback = false;
  std::string error;  // the mode could not run (e.g. the samples do not pack); empty if it did
};

absl::StatusOr<std::vector<ExchangeBenchRow>> RunExchangeBench(const ExchangeBenchOptions& options);

// A fixed-width table, one line per row. A mode that fails (its samples do
// not pack, a transport errs) is reported in its row; only a workload that
// cannot be generated fails the whole run.
std::string FormatExchangeTable(const std::vector<ExchangeBenchRow>& rows);
// A JSON array, one object per row; absent values are null.
std::string FormatExchangeJson(const std::vector<ExchangeBenchRow>& rows);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_BENCH_EXCHANGE_BENCH_H_
