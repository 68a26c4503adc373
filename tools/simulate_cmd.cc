// `tutti simulate`: what a job config does to the balance of a run, before
// any GPU is spent. Plans a range of steps with the packer's planning core
// (exactly what tutti-packerd would serve) and summarises, per phase, how far
// the slowest rank is from the mean with tutti's plan and with the drawn
// split it replaces, the share of every step the other ranks would spend
// waiting for the slowest, the exchange volume and the planning time.
// With --ladder or --fit-experiment: the cluster simulator with its time
// model (tools/sim/).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/packer/core/planner.h"
#include "services/packer/load_job.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/locality_replay.h"
#include "tools/mixture_report.h"
#include "tools/sim/simulate_main.h"
#include "tools/stats.h"

namespace tutti::tools {
namespace {

// Per phase, over the simulated steps.
struct PhaseRun {
  std::string name;
  std::vector<double> after, before, bound;  // max/mean, drawn max/mean, lower bound/mean
  double max_sum = 0, mean_sum = 0, before_max_sum = 0;
};

int RunSimulate(int argc, char** argv) {
  std::string config, index;
  uint64_t from = 0, steps = 0;
  bool json = false;
  sim::SimulateFlags t;
  Cli cli(
      "tutti simulate --config JOB.textproto [--index FILE] [--from STEP] [--steps N]\n"
      "       tutti simulate --ladder [--model M] [--cluster C] [--world-sizes 8,64] [options]\n"
      "       tutti simulate --fit-experiment [--world-sizes 64] [--off-by 4] [options]\n"
      "       tutti simulate --egress [--nodes 320] [--dataset-bytes BYTES] [--caches 1/32,1] "
      "[options]",
      "Plans --steps steps from --from with the packer's planning core (what\n"
      "tutti-packerd would serve for this config and index) and reports, per phase (vit,\n"
      "audio, llm), the slowest rank's cost over the mean rank's (max/mean: mean, p95 and\n"
      "worst over the steps) for tutti's plan, the lower bound max(mean, largest item) over the\n"
      "mean, the same ratio for the drawn split the plan replaces, and the\n"
      "share of the phase the other ranks spend waiting for the slowest (1 - sum of means /\n"
      "sum of maxima); then the exchange volume per step and the planning time. With\n"
      "--locality-record (and --node-removals), each step planned with the shard homes the\n"
      "packer had after its recorded node changes (tutti-packerd --locality_record).\n\n"
      "--ladder: the cluster simulator. A workload (the seed's, or --index) planned with the\n"
      "packer's planning core under each rung of the ablation ladder (naive; + staging,\n"
      "prefetch; + modality segregation; + max-pixel curriculum; + seed-v1; + seed-v2;\n"
      "+ post-balancing; tutti), timed on a model (--model: vit400m-moe16b-a3b,\n"
      "vit675m-dense7b, vit675m-whisper-dense7b) and a cluster (--cluster: h100, h200, b200)\n"
      "from FLOPs or --calibration pairs: step time, tokens/s, idle share per phase,\n"
      "exchange and data-stall time, peak activation memory, efficiency against the ideal\n"
      "step and against text-only training, per world size (--world-sizes), curriculum\n"
      "stage (--stages) and synchronisation model (--sync). --plot FILE.png draws it.\n"
      "--fit-experiment: the online cost fit (cost.online_fit) on a job whose configured\n"
      "quadratic costs are --off-by times the true ones: slowest rank over the mean before\n"
      "and after the fit.\n"
      "--egress: NFS egress per epoch at --nodes nodes of --ranks-per-node ranks, a dataset\n"
      "of --dataset-bytes in --shard-bytes shards, each node's cache of each --caches size\n"
      "(fractions of the dataset or sizes such as 312G), against the limit r x dataset\n"
      "(r = --replication). Counted: the seed workload planned with post-balancing by the\n"
      "packer's planning core for --steps steps (not given: an epoch of the dataset), once\n"
      "without locality (today: every node stages every shard its ranks read) and once with\n"
      "shard homes (each node its home shards, for its ranks and the nodes it serves); every\n"
      "node's stager simulated as a cache evicting the least recently used shard, fed in\n"
      "plan order with the shards it reads a step; every miss a whole shard from the source.\n"
      "Modelled, not measured: a synthetic index in the seed's mix with the dataset's shard\n"
      "count but fewer samples a shard (its epochs repeat, reshuffled) and its bytes scaled\n"
      "to --dataset-bytes; no stager runs (`tutti bench locality --loopback` measures real\n"
      "stagers' counters).");
  cli.Flag("config", &config, "job config (text tutti.v1.JobConfig)");
  cli.Flag("index", &index,
           "index file; overrides the config's index_path (--ladder: the workload instead of "
           "the seed's)");
  cli.Flag("from", &from, "first step");
  cli.Flag("steps", &steps,
           "steps to simulate (not given: 100; --ladder 10; --fit-experiment 200; --egress an "
           "epoch)",
           1, 1000000);
  cli.Flag("json", &json, "JSON instead of a table");
  cli.Flag("ladder", &t.ladder, "run the ablation ladder with the time model");
  cli.Flag("fit-experiment", &t.fit_experiment, "measure the online cost fit");
  cli.Flag("egress", &t.egress, "NFS egress per epoch with and without shard homes");
  cli.Flag("nodes", &t.nodes, "--egress: nodes", 1, 1 << 20);
  cli.Flag("ranks-per-node", &t.ranks_per_node, "--egress: ranks per node", 1, 1024);
  cli.Flag("dataset-bytes", &t.dataset_bytes,
           "--egress: dataset size in bytes (suffixes K/M/G/T binary)");
  cli.Flag("shard-bytes", &t.shard_bytes,
           "--egress: shard size in bytes (suffixes K/M/G/T binary)");
  cli.Flag("caches", &t.caches,
           "--egress: each node's cache, comma-separated: fractions of the dataset (1/32, 0.125) "
           "or sizes (312G)");
  cli.Flag("replication", &t.replication, "--egress: home nodes per shard (locality)", 1, 16);
  cli.Flag("model", &t.model, "model preset");
  cli.Flag("cluster", &t.cluster, "cluster preset (8-GPU nodes)");
  cli.Flag("sync", &t.sync, "synchronisation model: allreduce, fsdp or both");
  cli.Flag("attention", &t.attention, "the ViT's attention: flash or eager");
  cli.Flag("world-sizes", &t.world_sizes, "ranks, comma-separated (the fit experiment: the first)");
  cli.Flag("stages", &t.stages,
           "curriculum stages' max_pixels, comma-separated (the fit experiment: the last)");
  cli.Flag("rungs", &t.rungs,
           "rungs to run, comma-separated ids (naive, staging, segregation, curriculum, seed-v1, "
           "seed-v2, post-balancing, tutti); empty: all");
  cli.Flag("samples", &t.samples,
           "samples of the seed workload (0: 400 per rank, at least 20,000; --egress: five "
           "steps' draws)");
  cli.Flag("audio-fraction", &t.audio_fraction,
           "share of the seed workload's VL samples with an audio clip (three modalities)");
  cli.Flag("calibration", &t.calibration,
           "measured pairs (tools/gpu_calibrate.py) for the ViT's and LLM's seconds");
  cli.Flag("peak-flops", &t.peak_flops, "override: dense bf16 FLOP/s per GPU");
  cli.Flag("util-vit", &t.util_vit, "override: achieved share of peak on the ViT's matmuls");
  cli.Flag("util-llm", &t.util_llm, "override: achieved share of peak on the LLM's matmuls");
  cli.Flag("util-attention", &t.util_attention, "override: achieved share of peak on attention");
  cli.Flag("nvlink-bandwidth", &t.nvlink_bandwidth, "override: bytes/s per GPU within a node");
  cli.Flag("network-bandwidth", &t.network_bandwidth, "override: bytes/s per GPU between nodes");
  cli.Flag("decode-threads", &t.decode_threads, "override: decode threads per node");
  cli.Flag("prefetch-window", &t.prefetch_window, "override: steps of batches prepared ahead");
  cli.Flag("off-by", &t.off_by, "the fit experiment: configured over true quadratic costs");
  cli.Flag("plot", &t.plot, "--ladder: draw the ladder and the per-rank spread into FILE.png");
  LocalityReplayFlags replay;
  replay.Register(&cli);
  int rc = 0;
  if (!cli.Parse(argc, argv, &rc)) return rc;
  if ((t.egress || t.ladder || t.fit_experiment) &&
      (!replay.record.empty() || !replay.removals.empty())) {
    std::fprintf(stderr,
                 "tutti simulate: --locality-record and --node-removals replay a job's node "
                 "changes with --config; --egress, --ladder and --fit-experiment plan workloads "
                 "of their own\n");
    return 2;
  }
  if (t.egress) {
    if (t.ladder || t.fit_experiment) {
      std::fprintf(stderr, "tutti simulate: give one of --ladder, --fit-experiment and --egress\n");
      return 2;
    }
    t.steps = steps;
    t.json = json;
    return sim::RunSimulateEgress(t);
  }
  if (t.ladder || t.fit_experiment) {
    t.index = index;
    t.from = from;
    t.steps = steps;
    t.json = json;
    return sim::RunSimulateModels(t);
  }
  if (steps == 0) steps = 100;
  if (config.empty()) {
    std::fprintf(stderr, "tutti simulate: --config is required (see --help)\n");
    return 2;
  }
  packer::JobOptions job_options;
  if (absl::Status s = replay.AddTo(&job_options); !s.ok()) {
    std::fprintf(stderr, "tutti simulate: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  auto job = packer::LoadJob(config, index, job_options);
  if (!job.ok()) {
    std::fprintf(stderr, "tutti simulate: %s\n", std::string(job.status().message()).c_str());
    return 1;
  }
  // The homes by step after the node changes the packer recorded, if given.
  auto locality = replay.Load(*job, job_options);
  if (!locality.ok()) {
    std::fprintf(stderr, "tutti simulate: %s\n", std::string(locality.status().message()).c_str());
    return 1;
  }
  packer::Planner planner(*job, locality->get());
  packer::StepPlanData d;
  MixtureReport mixture(**job);
  PhaseRun phases[3] = {{"vit"}, {"audio"}, {"llm"}};
  std::vector<double> plan_ms;
  double inter = 0, intra = 0, load = 0;
  uint64_t done = 0;
  for (uint64_t s = from; s < from + steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status status = planner.Plan(s, &d);
    if (absl::IsOutOfRange(status) && done > 0) {
      std::fprintf(stderr, "tutti simulate: stopping at step %llu: %s\n",
                   static_cast<unsigned long long>(s), std::string(status.message()).c_str());
      break;
    }
    if (!status.ok()) {
      std::fprintf(stderr, "tutti simulate: %s\n", std::string(status.message()).c_str());
      return 1;
    }
    plan_ms.push_back(1e3 * SecondsSince(t0));
    mixture.Add(d);
    const packer::PhaseSummary* summary[3] = {&d.vit, &d.audio_phase, &d.llm};
    for (int p = 0; p < 3; ++p) {
      const packer::PhaseSummary& x = *summary[p];
      if (x.mean <= 0) continue;  // no work of this kind in the step
      phases[p].after.push_back(x.imbalance);
      phases[p].before.push_back(x.imbalance_before);
      phases[p].bound.push_back(x.lower_bound / x.mean);
      phases[p].max_sum += x.max;
      phases[p].mean_sum += x.mean;
      phases[p].before_max_sum += x.mean * x.imbalance_before;
    }
    inter += d.inter_node_bytes;
    intra += d.intra_node_bytes;
    load += d.remote_load_bytes;
    if ((++done % 50) == 0 && !json) {
      std::fprintf(stderr, "\r%llu/%llu steps planned", static_cast<unsigned long long>(done),
                   static_cast<unsigned long long>(steps));
    }
  }
  if (done >= 50 && !json) std::fprintf(stderr, "\n");
  const packer::Job& j = **job;
  auto wait_share = [](double mean_sum, double max_sum) {
    return max_sum > 0 ? 1 - mean_sum / max_sum : 0.0;
  };
  if (json) {
    std::printf("[\n");
    bool first = true;
    for (const PhaseRun& p : phases) {
      if (p.after.empty()) continue;
      std::printf(
          "%s  {\"phase\": \"%s\", \"steps\": %zu, \"imbalance_mean\": %.6f, \"imbalance_p95\": "
          "%.6f, \"imbalance_max\": %.6f, \"lower_bound_mean\": %.6f, \"drawn_imbalance_mean\": "
          "%.6f, \"wait_share\": %.6f, "
          "\"drawn_wait_share\": %.6f, \"inter_node_bytes_per_step\": %.0f, "
          "\"plan_ms_median\": %.3f}",
          first ? "" : ",\n", p.name.c_str(), p.after.size(), Mean(p.after),
          Quantile(p.after, 0.95), Quantile(p.after, 1.0), Mean(p.bound), Mean(p.before),
          wait_share(p.mean_sum, p.max_sum), wait_share(p.mean_sum, p.before_max_sum), inter / done,
          Quantile(plan_ms, 0.5));
      first = false;
    }
    const std::string sources = mixture.Json();
    if (!sources.empty()) std::printf("%s%s", first ? "" : ",\n", sources.c_str());
    std::printf("\n]\n");
    return 0;
  }
  std::printf("%llu steps from step %llu, %u ranks (%u per node), strategy %s%s\n",
              static_cast<unsigned long long>(done), static_cast<unsigned long long>(from),
              j.config().world_size(), j.config().ranks_per_node(), j.plan_strategy().c_str(),
              j.config().post_balancing().enabled() ? ", post-balancing" : "");
  std::printf("%-6s %22s %12s %17s %10s %14s\n", "phase", "max/mean mean/p95/max", "lower bound",
              "drawn split mean", "waiting", "drawn waiting");
  for (const PhaseRun& p : phases) {
    if (p.after.empty()) continue;
    std::printf("%-6s %22s %12.3f %17.3f %9.1f%% %13.1f%%\n", p.name.c_str(),
                absl::StrFormat("%.3f/%.3f/%.3f", Mean(p.after), Quantile(p.after, 0.95),
                                Quantile(p.after, 1.0))
                    .c_str(),
                Mean(p.bound), Mean(p.before), 100 * wait_share(p.mean_sum, p.max_sum),
                100 * wait_share(p.mean_sum, p.before_max_sum));
  }
  std::printf(
      "exchange per step: %.1f MB between nodes, %.1f MB within nodes, %.1f MB loaded "
      "from other nodes\n",
      inter / done / 1e6, intra / done / 1e6, load / done / 1e6);
  std::printf("plan time: %.2f ms median, %.2f ms p99\n", Quantile(plan_ms, 0.5),
              Quantile(plan_ms, 0.99));
  std::fputs(mixture.Table().c_str(), stdout);
  return 0;
}

}  // namespace
}  // namespace tutti::tools

TUTTI_COMMAND("simulate", "plan a range of steps and report the balance a job config gives",
              tutti::tools::RunSimulate);
