// `tutti bench exchange`: post-balancing on the seed workload.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "services/packer/bench/exchange_bench.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/exchange_mpi_bench.h"

namespace tutti::tools {
namespace {

int RunBenchExchange(int argc, char** argv) {
  packer::ExchangeBenchOptions o;
  std::string ranks = "16,256,2560";
  std::string transport = "none";
  bool json = false;
  MpiExchangeBenchOptions mpi;
  Cli cli(
      "tutti bench exchange [options]\n"
      "  mpirun -np N tutti bench exchange --transport mpi --ranks N --ranks-per-node M",
      "Batch post-balancing on the seed workload (bench packer's: seq_len 32768, 4 sequences "
      "per rank, 80% text-only samples with lognormal lengths of median 1000 tokens, 20% VL "
      "samples with 1-4 images: 90% up to 2 MP, 10% up to 16 MP, smart-resized to "
      "--max-pixels), one step planned by the packer's own Job and Planner exactly as "
      "tutti-packerd plans it. For every world size (8-rank nodes) it reports the phase "
      "imbalance (max/mean) with no balancing (`none`: the drawn round-robin split), with "
      "pre-balancing only (`pre`: the colocated plan of --pre-strategy, every image encoded on "
      "its sample's rank) and with post-balancing (`post`), the inter-node bytes of the "
      "node-aware plan and of a node-oblivious plan of the same balance, the gap of the fast "
      "rearrangement to the GLPK optimum on a 2-node x 2-rank sub-instance (small world "
      "sizes), and the median plan time on one core (wall and thread CPU time). With "
      "--transport mpi, under mpirun with as many processes as --ranks, every post plan's "
      "forward exchange (each rank's lists from the StepPlan the daemon would serve) also runs "
      "through the client library's MPI transport (every byte checked, forward and backward) "
      "and, interleaved, through a bare MPI_Alltoallv of the same bytes: "
      "client_vs_bare_throughput is the ratio of their throughputs.");
  cli.Flag("ranks", &ranks, "comma-separated world sizes");
  cli.Flag("ranks-per-node", &o.workload.ranks_per_node, "ranks per node");
  cli.Flag("seq-len", &o.workload.seq_len, "tokens per packed sequence");
  cli.Flag("sequences", &o.workload.seqs_per_rank,
           "sequences per rank per step (split into text and VL by the dataset's mix)");
  cli.Flag("fill", &o.workload.fill, "fraction of each modality's token room the step fills");
  cli.Flag("max-pixels", &o.max_pixels,
           "smart-resize max_pixels (curriculum stage): 1003520 ~ 1 MP, 16777216 = 16 MP");
  cli.Flag("shard-nodes", &o.shard_nodes,
           "nodes whose stager has each shard (0 = every node); fewer makes inputs remote");
  cli.Flag("audio-share", &o.workload.audio_fraction,
           "fraction of VL samples that also carry an audio clip");
  cli.Flag("samples", &o.samples,
           "synthetic dataset size (0: two steps of the largest world, at least 50,000)");
  cli.Flag("step", &o.step, "the step planned");
  cli.Flag("padded", &o.padded,
           "padded LLM cost: a micro-batch costs as if every sequence were its longest");
  cli.Flag("tolerance", &o.balance_tolerance,
           "post_balancing.balance_tolerance: rank cost <= (1+t) x lower bound, or (1+t) x the "
           "balancer's makespan when that is out of reach; negative: the job's default");
  cli.Flag("hidden-size", &o.hidden_size,
           "LLM hidden size of the embedding bytes (bf16); 0 = 4096. Scales the exchange sizes");
  cli.Flag("pre-strategy", &o.pre_strategy,
           "the packer strategy of the `pre` mode (greedy, seed-v1, seed-v2, tutti)");
  cli.Flag("repeats", &o.plan_repeats, "timed plans per world size (the median is reported)");
  cli.Flag("glpk-max-world", &o.glpk_max_world,
           "run GLPK (on a 2x2 sub-instance) for world sizes up to this; 0 = never");
  cli.Flag("glpk-time-limit", &o.glpk_time_limit_s, "seconds GLPK may take per sub-instance");
  cli.Flag("seed", &o.workload.seed, "workload seed");
  cli.Flag("json", &json, "print one JSON object per (mode, world size) instead of a table");
  cli.Flag("transport", &transport,
           "also run each post plan's exchange over a transport: none, or mpi (under mpirun)");
  cli.Flag("iterations", &mpi.iterations, "--transport: timed exchanges of each kind");
  cli.Flag("warmup", &mpi.warmup, "--transport: untimed exchanges of each kind first");
  int rc = 0;
  if (!cli.Parse(argc, argv, &rc)) return rc;
  o.world_sizes.clear();
  for (absl::string_view part : absl::StrSplit(ranks, ',', absl::SkipEmpty())) {
    uint32_t w = 0;
    if (!absl::SimpleAtoi(part, &w) || w == 0) {
      std::fprintf(stderr, "--ranks: '%s' is not a positive whole number\n",
                   std::string(part).c_str());
      return 2;
    }
    o.world_sizes.push_back(w);
  }
  bool speaker = true;  // rank 0 under mpirun prints; the others only compute
  packer::TransportBenchFn mpi_fn;
  if (transport == "mpi") {
    auto world = InitMpiWorld();
    if (!world.ok()) {
      std::fprintf(stderr, "--transport mpi: %s\n", std::string(world.status().message()).c_str());
      return 1;
    }
    for (uint32_t w : o.world_sizes) {
      if (w != world->size) {
        if (world->rank == 0) {
          std::fprintf(stderr,
                       "--transport mpi: --ranks %u but mpirun started %u processes; every world "
                       "size must equal the process count, e.g. mpirun -np %u tutti bench "
                       "exchange --transport mpi --ranks %u\n",
                       w, world->size, w, w);
        }
        return 2;
      }
    }
    speaker = world->rank == 0;
    if (!speaker) o.glpk_max_world = 0;  // rank 0 reports the GLPK gap
    mpi_fn = [mpi](const packer::Job& job, const packer::StepPlanData& plan) {
      return RunMpiExchangeBench(mpi, job, plan);
    };
    o.transport = &mpi_fn;
  } else if (transport != "none") {
    std::fprintf(stderr, "--transport %s: unknown; use none or mpi\n", transport.c_str());
    return 2;
  }
  if (speaker) {
    o.progress = [](const std::string& line) {
      std::fprintf(stderr, "[bench exchange] %s\n", line.c_str());
    };
  }
  auto rows = packer::RunExchangeBench(o);
  if (!rows.ok()) {
    std::fprintf(stderr, "tutti bench exchange: %s\n",
                 std::string(rows.status().message()).c_str());
    return 1;
  }
  if (!speaker) return 0;
  const std::string out =
      json ? packer::FormatExchangeJson(*rows) : packer::FormatExchangeTable(*rows);
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace
}  // namespace tutti::tools

TUTTI_COMMAND("bench exchange", "post-balancing: phase imbalance, inter-node bytes, plan time",
              tutti::tools::RunBenchExchange);
