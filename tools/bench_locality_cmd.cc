// `tutti bench locality`: NFS egress per epoch with shard homes against
// today's behaviour, the balance paid, stager-to-stager bytes, plan time.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/byte_size.h"
#include "services/packer/bench/locality_bench.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/locality_loopback.h"

namespace tutti::tools {
namespace {

int RunLoopback(LoopbackOptions lo, const std::string& replications, bool json) {
  lo.replications.clear();
  for (absl::string_view part : absl::StrSplit(replications, ',', absl::SkipEmpty())) {
    uint32_t r = 0;
    if (!absl::SimpleAtoi(part, &r) || r > 16) {
      std::fprintf(stderr, "--loopback-replications: '%s' is not a replication in 0..16\n",
                   std::string(part).c_str());
      return 2;
    }
    lo.replications.push_back(r);
  }
  if (lo.replications.empty()) {
    std::fprintf(stderr, "--loopback-replications: give at least one, e.g. 0,1,2\n");
    return 2;
  }
  if (lo.dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    lo.dir =
        std::string(tmp && *tmp ? tmp : "/tmp") + "/tutti-loopback-" + std::to_string(getpid());
  }
  lo.progress = [](const std::string& line) {
    std::fprintf(stderr, "[bench locality --loopback] %s\n", line.c_str());
  };
  auto runs = RunLocalityLoopback(lo);
  if (!runs.ok()) {
    std::fprintf(stderr, "tutti bench locality --loopback: %s\n",
                 std::string(runs.status().message()).c_str());
    return 1;
  }
  const std::string out = json ? FormatLoopbackJson(*runs) : FormatLoopbackTable(lo, *runs);
  std::fputs(out.c_str(), stdout);
  return 0;
}

int RunBenchLocality(int argc, char** argv) {
  packer::LocalityBenchOptions o;
  std::string dataset = "10000000000000", shard = "1000000000", caches = "1/32,1/8,1";
  bool json = false;
  Cli cli("tutti bench locality [options]",
          "What shard homes (job config locality) save at cluster scale: a synthetic dataset "
          "in the seed's mix cut into as many shards as --dataset-bytes / --shard-bytes, steps "
          "of the seed workload (bench exchange's) planned with post-balancing by the packer's "
          "own Job and Planner with locality and without it. Reports NFS egress per epoch, "
          "counted: an epoch of steps planned with and without homes, every node's stager "
          "simulated as an LRU cache of each --caches size over the shards its plans name in "
          "plan order (today every node stages every shard its ranks read; with homes a node "
          "reads its home shards, for its ranks and for the nodes it serves), every miss a "
          "shard read from the source, beside the limit r x dataset; and a check that no plan "
          "loads an input locally off its shard's home. Modelled: the synthetic index holds "
          "fewer samples a shard than the dataset (its epochs repeat, reshuffled, to fill the "
          "dataset's epoch) and its bytes are scaled to --dataset-bytes. Measured over --steps "
          "steps: the ViT phase's slowest rank over its lower bound with and without locality, "
          "the member bytes sent stager to stager per step and the median plan time on one "
          "thread. `tutti simulate --egress` prints the egress alone.");
  cli.Flag("ranks", &o.world_size, "world size");
  cli.Flag("ranks-per-node", &o.workload.ranks_per_node, "ranks per node");
  cli.Flag("dataset-bytes", &dataset, "dataset size in bytes (decimal; suffixes K/M/G/T binary)");
  cli.Flag("shard-bytes", &shard, "shard size in bytes (decimal; suffixes K/M/G/T binary)");
  cli.Flag("replication", &o.replication, "locality.home_replication");
  cli.Flag("caches", &caches,
           "each node's cache, comma-separated: fractions of the dataset (1/32, 0.125) or sizes "
           "(312G)");
  cli.Flag("steps", &o.steps, "steps planned and measured");
  cli.Flag("egress-steps", &o.count_steps,
           "steps the caches are simulated over (0: an epoch of the dataset)");
  cli.Flag("samples", &o.samples, "synthetic samples in the index (0: the steps' draws and more)");
  cli.Flag("max-pixels", &o.max_pixels, "smart-resize max_pixels of the curriculum stage");
  cli.Flag("tolerance", &o.balance_tolerance,
           "post_balancing.balance_tolerance; negative: the job's default");
  cli.Flag("seed", &o.workload.seed, "workload seed");
  cli.Flag("json", &json, "print one JSON object instead of a table");
  bool loopback = false;
  std::string replications = "0,1,2";
  LoopbackOptions lo;
  cli.Flag("loopback", &loopback,
           "instead: real stagers on this host (tools/locality_loopback.h): a generated dataset, "
           "one packer, --loopback-nodes stagers with --peers, their ranks taking every batch of "
           "one epoch, per --loopback-replications; source and peer bytes from the stagers' "
           "counters");
  cli.Flag("loopback-nodes", &lo.nodes, "--loopback: stagers (nodes)", 2, 64);
  cli.Flag("loopback-ranks-per-node", &lo.ranks_per_node, "--loopback: ranks per node", 1, 64);
  cli.Flag("loopback-samples", &lo.samples, "--loopback: generated samples", 16, 1000000);
  cli.Flag("loopback-samples-per-shard", &lo.samples_per_shard, "--loopback: samples a shard", 1,
           1000000);
  cli.Flag("loopback-replications", &replications,
           "--loopback: home_replication per run, comma-separated (0: locality off)");
  cli.Flag("loopback-post-balancing", &lo.post_balancing, "--loopback: post-balancing on");
  cli.Flag("loopback-dir", &lo.dir,
           "--loopback: work directory, emptied and removed (default: under $TMPDIR)");
  int rc = 0;
  if (!cli.Parse(argc, argv, &rc)) return rc;
  if (loopback) return RunLoopback(lo, replications, json);
  if (!ParseByteSize(dataset, &o.dataset_bytes) || !ParseByteSize(shard, &o.shard_bytes)) {
    std::fprintf(stderr, "--dataset-bytes / --shard-bytes: give a size such as 1000000000 or 1G\n");
    return 2;
  }
  auto fractions = packer::ParseCacheSizes(caches, o.dataset_bytes);
  if (!fractions.ok()) {
    std::fprintf(stderr, "--caches: %s\n", std::string(fractions.status().message()).c_str());
    return 2;
  }
  o.cache_fractions = *fractions;
  o.progress = [](const std::string& line) {
    std::fprintf(stderr, "[bench locality] %s\n", line.c_str());
  };
  auto r = packer::RunLocalityBench(o);
  if (!r.ok()) {
    std::fprintf(stderr, "tutti bench locality: %s\n", std::string(r.status().message()).c_str());
    return 1;
  }
  const std::string out = json ? packer::FormatLocalityJson(*r) : packer::FormatLocalityTable(*r);
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace
}  // namespace tutti::tools

TUTTI_COMMAND("bench locality", "shard homes: NFS egress per epoch, balance paid, plan time",
              tutti::tools::RunBenchLocality);
