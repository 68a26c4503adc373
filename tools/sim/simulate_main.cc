#include "tools/sim/simulate_main.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/byte_size.h"
#include "common/status.h"
#include "services/packer/bench/nfs_egress.h"
#include "tools/sim/calibration.h"
#include "tools/sim/fit_experiment.h"
#include "tools/sim/report.h"

#ifndef TUTTI_PYTHON_EXECUTABLE
#define TUTTI_PYTHON_EXECUTABLE "/usr/bin/python3"
#endif

namespace tutti::sim {
namespace {

absl::Status Override(const char* flag, const std::string& text, double* value) {
  if (text.empty()) return absl::OkStatus();
  if (!absl::SimpleAtod(text, value)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " '", text, "' is not a number"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> List(const char* flag, const std::string& text) {
  std::vector<uint64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    uint64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " '", text, "' is not a list of positive numbers like 8,64"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  return out;
}

std::string Python() {
  const char* py = std::getenv("TUTTI_PYTHON");
  return py && *py ? py : TUTTI_PYTHON_EXECUTABLE;
}

}  // namespace

absl::StatusOr<SimSetup> SetupFromFlags(const SimulateFlags& f, uint32_t max_world) {
  SimSetup s;
  ASSIGN_OR_RETURN(s.model, ModelPreset(f.model));
  ASSIGN_OR_RETURN(s.cluster, ClusterPreset(f.cluster));
  RETURN_IF_ERROR(Override("peak-flops", f.peak_flops, &s.cluster.peak_flops));
  RETURN_IF_ERROR(Override("util-vit", f.util_vit, &s.cluster.util_vit));
  RETURN_IF_ERROR(Override("util-llm", f.util_llm, &s.cluster.util_llm));
  RETURN_IF_ERROR(Override("util-attention", f.util_attention, &s.cluster.util_attention));
  RETURN_IF_ERROR(Override("nvlink-bandwidth", f.nvlink_bandwidth, &s.cluster.nvlink_bandwidth));
  RETURN_IF_ERROR(Override("network-bandwidth", f.network_bandwidth, &s.cluster.network_bandwidth));
  double threads = s.cluster.decode_threads, window = s.data.prefetch_window;
  RETURN_IF_ERROR(Override("decode-threads", f.decode_threads, &threads));
  RETURN_IF_ERROR(Override("prefetch-window", f.prefetch_window, &window));
  if (!(threads >= 1 && threads <= 1e5 && threads == std::floor(threads))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--decode-threads ", threads, " is not a whole number of threads >= 1"));
  }
  if (!(window >= 0 && window <= 256 && window == std::floor(window))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prefetch-window ", window, " is not a whole number of steps in 0..256"));
  }
  s.cluster.decode_threads = static_cast<uint32_t>(threads);
  s.data.decode_threads = s.cluster.decode_threads;
  s.data.prefetch_window = static_cast<uint32_t>(window);
  RETURN_IF_ERROR(ValidateModelShape(s.model));
  RETURN_IF_ERROR(ValidateCluster(s.cluster));
  if (f.sync == "both") {
    s.syncs = {SyncModel::kAllReduce, SyncModel::kFsdp};
  } else {
    ASSIGN_OR_RETURN(SyncModel sync, ParseSyncModel(f.sync));
    s.syncs = {sync};
  }
  ASSIGN_OR_RETURN(s.attention, ParseAttention(f.attention));
  s.timing = TimingFromShape(s.model, s.cluster, s.attention);
  if (!f.calibration.empty()) {
    ASSIGN_OR_RETURN(CalibrationPairs pairs, ReadCalibration(f.calibration));
    ASSIGN_OR_RETURN(Calibrated c, FitCalibration(pairs, s.attention, s.timing));
    s.timing = c.timing;
  }
  if (!(f.audio_fraction >= 0 && f.audio_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--audio-fraction ", f.audio_fraction, " is not in [0, 1]"));
  }
  s.workload.audio_fraction = f.audio_fraction;
  s.workload.ranks_per_node = s.cluster.ranks_per_node;
  s.workload.patch_size = s.model.vision.patch_size;
  s.workload.merge_size = s.model.vision.merge_size;
  s.from = f.from;
  if (!f.index.empty()) {
    ASSIGN_OR_RETURN(s.index, packer::LoadIndex(f.index));
  } else {
    // Enough for the job's check that each stream holds two steps' draw at
    // the largest world: a rank draws ~30 VL samples a step (0.87 x 2 x
    // 32,768 tokens of ~2,000-token samples at 16 MP), a fifth of the
    // samples are VL.
    const uint64_t samples =
        f.samples ? f.samples : std::max<uint64_t>(20000, uint64_t{max_world} * 400);
    ASSIGN_OR_RETURN(s.index, packer::MakeSeedIndex(s.workload, samples));
  }
  return s;
}

int RunSimulateEgress(const SimulateFlags& f) {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "tutti simulate --egress: %s\n", std::string(s.message()).c_str());
    return absl::IsInvalidArgument(s) ? 2 : 1;
  };
  packer::EgressOptions o;
  if (f.nodes == 0 || f.ranks_per_node == 0) {
    return fail(absl::InvalidArgumentError("--nodes and --ranks-per-node must be at least 1"));
  }
  if (uint64_t{f.nodes} * f.ranks_per_node > (1u << 20)) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "--nodes ", f.nodes, " x --ranks-per-node ", f.ranks_per_node, " ranks: at most 1048576")));
  }
  o.world_size = f.nodes * f.ranks_per_node;
  o.workload.ranks_per_node = f.ranks_per_node;
  if (!ParseByteSize(f.dataset_bytes, &o.dataset_bytes) || o.dataset_bytes == 0) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "--dataset-bytes '", f.dataset_bytes, "' is not a size such as 10000000000000 or 10T")));
  }
  if (!ParseByteSize(f.shard_bytes, &o.shard_bytes) || o.shard_bytes == 0) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "--shard-bytes '", f.shard_bytes, "' is not a size such as 1000000000 or 1G")));
  }
  auto caches = packer::ParseCacheSizes(f.caches, o.dataset_bytes);
  if (!caches.ok()) {
    return fail(absl::InvalidArgumentError(absl::StrCat("--caches: ", caches.status().message())));
  }
  o.cache_fractions = *caches;
  o.replication = f.replication;
  o.count_steps = f.steps;
  o.samples = f.samples;
  if (!f.json) {
    o.progress = [](const std::string& line) {
      std::fprintf(stderr, "[simulate egress] %s\n", line.c_str());
    };
  }
  auto setup = packer::MakeEgressSetup(o);
  if (!setup.ok()) return fail(setup.status());
  auto r = packer::CountEgress(*setup, o);
  if (!r.ok()) return fail(r.status());
  if (f.json) {
    std::printf("{%s}\n", packer::FormatEgressJsonFields(*r).c_str());
  } else {
    std::printf("W = %u ranks on %u nodes, %u shards of %s, r = %u\n", r->ranks, r->nodes,
                r->shards, FormatBytes(o.shard_bytes).c_str(), r->replication);
    std::fputs(packer::FormatEgressTable(*r).c_str(), stdout);
  }
  return 0;
}

int RunSimulateModels(const SimulateFlags& f) {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "tutti simulate: %s\n", std::string(s.message()).c_str());
    return absl::IsInvalidArgument(s) || absl::IsNotFound(s) ? 2 : 1;
  };
  if (f.ladder == f.fit_experiment) {
    std::fprintf(stderr, "tutti simulate: give one of --ladder and --fit-experiment\n");
    return 2;
  }
  auto worlds = List("world-sizes", f.world_sizes);
  if (!worlds.ok()) return fail(worlds.status());
  uint64_t max_world = 0;
  for (uint64_t w : *worlds) {
    if (w > (1u << 20)) return fail(absl::InvalidArgumentError("--world-sizes: at most 1048576"));
    max_world = std::max(max_world, w);
  }
  auto setup = SetupFromFlags(f, static_cast<uint32_t>(max_world));
  if (!setup.ok()) return fail(setup.status());
  SimSetup& s = *setup;
  if (f.fit_experiment) {
    FitExperimentOptions o;
    o.world_size = static_cast<uint32_t>(worlds->front());
    o.steps = f.steps ? f.steps : 200;
    o.off_by = f.off_by;
    auto stages = List("stages", f.stages);
    if (!stages.ok()) return fail(stages.status());
    o.max_pixels = stages->back();
    auto r = RunFitExperiment(s, o);
    if (!r.ok()) return fail(r.status());
    std::fputs((f.json ? FitExperimentJson(o, *r) : FitExperimentText(o, *r)).c_str(), stdout);
    return 0;
  }
  s.steps = f.steps ? f.steps : 10;
  auto stages = List("stages", f.stages);
  if (!stages.ok()) return fail(stages.status());
  std::vector<std::string> only;
  for (absl::string_view id : absl::StrSplit(f.rungs, ',', absl::SkipEmpty())) {
    only.emplace_back(id);
  }
  std::vector<LadderRun> runs;
  for (uint64_t w : *worlds) {
    for (uint64_t stage : *stages) {
      if (!f.json) {
        std::fprintf(stderr, "simulating W = %llu at %llu max_pixels...\n",
                     static_cast<unsigned long long>(w), static_cast<unsigned long long>(stage));
      }
      auto r = RunLadder(s, static_cast<uint32_t>(w), stage, only);
      if (!r.ok()) return fail(r.status());
      runs.push_back({static_cast<uint32_t>(w), stage, std::move(*r)});
    }
  }
  const std::string json = LadderJson(s, runs);
  std::fputs((f.json ? json : LadderTable(s, runs)).c_str(), stdout);
  if (!f.plot.empty()) {
    if (absl::Status p = PlotLadder(json, f.plot, Python()); !p.ok()) return fail(p);
    if (!f.json) std::printf("drew %s\n", f.plot.c_str());
  }
  return 0;
}

}  // namespace tutti::sim
