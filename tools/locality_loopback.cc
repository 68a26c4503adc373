#include "tools/locality_loopback.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/http_client.h"
#include "common/status.h"
#include "common/stop_signal.h"
#include "services/packer/core/planner.h"
#include "services/packer/index/index_builder.h"
#include "services/packer/load_job.h"
#include "services/packer/packer_server.h"
#include "services/stager/stager_server.h"
#include "tools/datagen/dataset_gen.h"

namespace tutti::tools {
namespace {

namespace fs = std::filesystem;

// The e2e tests' job (tests/e2e_support.cc) at `ranks` ranks, one epoch.
std::string JobConfig(const std::string& id, const std::string& index, uint32_t ranks,
                      uint32_t ranks_per_node, bool post_balancing, uint32_t replication) {
  std::string c = absl::StrCat("job_id: \"", id, "\"\nindex_path: \"", index,
                               "\"\nepochs: 1\nseed: 5\nworld_size: ", ranks,
                               "\nranks_per_node: ", ranks_per_node, R"pb(
    plan_window: 4
    batch {
      text_samples_per_step: 16
      vl_samples_per_step: 8
      grad_accum: 2
      text_micro_batch: 1
      vl_micro_batch: 1
      text_vl_ratio: "1:1"
    }
    curriculum { start_step: 0 max_pixels: 262144 seq_len: 8192 }
    sample_deadline_ms: 30000
  )pb");
  absl::StrAppend(&c, "post_balancing { enabled: ", post_balancing ? "true" : "false",
                  " hidden_size: 1024 }\n");
  if (replication > 0) absl::StrAppend(&c, "locality { home_replication: ", replication, " }\n");
  return c;
}

double Metric(int port, const std::string& name) {
  absl::StatusOr<std::string> page = HttpGet(port, "/metrics");
  if (!page.ok()) return 0;
  return MetricValue(*page, name).value_or(0);
}

absl::StatusOr<LoopbackRun> RunOnce(const LoopbackOptions& o, const std::string& index,
                                    double dataset_bytes, uint32_t replication) {
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  const uint32_t ranks = o.nodes * o.ranks_per_node;
  const std::string dir = absl::StrCat(o.dir, "/r", replication);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const std::string config = dir + "/job.textproto";
  {
    // Stagers name shared memory after the job: distinct per process and run.
    std::ofstream out(config);
    out << JobConfig(absl::StrCat("loopback-", getpid(), "-r", replication), index, ranks,
                     o.ranks_per_node, o.post_balancing, replication);
    if (!out) return absl::InternalError("cannot write " + config);
  }
  LoopbackRun run;
  run.replication = replication;
  run.dataset_bytes = dataset_bytes;

  // The plans the packer serves, planned again (deterministic): the ViT
  // phase's balance.
  ASSIGN_OR_RETURN(std::shared_ptr<const packer::Job> job, packer::LoadJob(config, ""));
  run.steps = job->total_steps();
  if (run.steps == 0) return absl::InternalError("the job has no steps");
  {
    packer::Planner planner(job);
    packer::StepPlanData d;
    double sum = 0;
    for (uint64_t s = 0; s < run.steps; ++s) {
      RETURN_IF_ERROR(planner.Plan(s, &d));
      const double v = d.vit.lower_bound > 0 ? d.vit.max / d.vit.lower_bound : 1;
      sum += v;
      run.vit_over_bound_max = std::max(run.vit_over_bound_max, v);
    }
    run.vit_over_bound_mean = sum / static_cast<double>(run.steps);
  }

  packer::PackerServerOptions po;
  po.config_path = config;
  po.listen = "127.0.0.1:0";
  po.metrics = "127.0.0.1:0";
  po.plan_threads = 1;
  packer::PackerServer packerd(po);
  StopSignal never;
  RETURN_IF_ERROR(packerd.Start(never));

  std::map<uint32_t, std::string> peers;
  for (uint32_t n = 0; n < o.nodes; ++n) peers[n] = absl::StrCat("unix://", dir, "/stager", n);
  std::vector<std::unique_ptr<stager::StagerServer>> stagers;
  for (uint32_t n = 0; n < o.nodes; ++n) {
    stager::StagerServerOptions so;
    so.packer = absl::StrCat("127.0.0.1:", packerd.port());
    so.listen = peers[n];
    so.metrics = "127.0.0.1:0";
    so.packer_wait = absl::Seconds(60);
    // The node is learned from its first rank's call, so no stager builds a
    // batch (asking a holder still starting) before every one is up.
    so.core.node_auto = true;
    so.core.cache_dir = absl::StrCat(dir, "/cache", n);
    so.core.staging.source_dir = o.dir + "/ds";
    so.core.decode_threads = o.decode_threads;
    if (replication > 0) so.peers = peers;
    stagers.push_back(std::make_unique<stager::StagerServer>(so));
    RETURN_IF_ERROR(stagers.back()->Start());
  }
  say(absl::StrCat(replication == 0 ? "locality off" : absl::StrCat("r = ", replication), ": ",
                   o.nodes, " stagers, ", ranks, " ranks, ", run.steps, " steps"));

  // Each node's ranks take and release every step's batch.
  absl::Mutex mu;
  absl::Status failed;
  uint64_t batches = 0, skipped = 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      stager::StagerServer& s = *stagers[r / o.ranks_per_node];
      for (uint64_t step = 0; step < run.steps; ++step) {
        absl::StatusOr<v1::BatchDescriptor> d = s.core()->Acquire(step, r, 60000);
        absl::Status st = d.ok() ? s.core()->Release(step, r) : d.status();
        absl::MutexLock l(&mu);
        if (!st.ok()) {
          if (failed.ok()) {
            failed =
                absl::InternalError(absl::StrCat("rank ", r, " step ", step, ": ", st.message()));
          }
          return;
        }
        ++batches;
        skipped += static_cast<uint64_t>(d->skipped_size());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  run.batches = batches;
  run.skipped = skipped;
  for (auto& s : stagers) {
    const int port = s->metrics_port();
    run.source_bytes += Metric(port, "tutti_stager_source_bytes_total");
    run.peer_sent_bytes += Metric(port, "tutti_stager_peer_bytes_total{direction=\"sent\"}");
    run.peer_received_bytes +=
        Metric(port, "tutti_stager_peer_bytes_total{direction=\"received\"}");
    run.peer_received_members +=
        Metric(port, "tutti_stager_peer_members_total{outcome=\"received\"}");
    run.peer_fallback_members +=
        Metric(port, "tutti_stager_peer_members_total{outcome=\"fallback\"}");
  }
  for (auto& s : stagers) s->Shutdown();
  packerd.Shutdown();
  if (!failed.ok()) return failed;
  return run;
}

}  // namespace

absl::StatusOr<std::vector<LoopbackRun>> RunLocalityLoopback(const LoopbackOptions& o) {
  if (o.dir.empty()) return absl::InvalidArgumentError("the loopback bench needs a directory");
  if (o.nodes < 2 || o.ranks_per_node == 0) {
    return absl::InvalidArgumentError("the loopback bench needs at least 2 nodes of 1 rank");
  }
  for (uint32_t r : o.replications) {
    if (r > o.nodes) {
      return absl::InvalidArgumentError(
          absl::StrCat("replication ", r, " is more than the ", o.nodes, " nodes"));
    }
  }
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  std::error_code ec;
  fs::remove_all(o.dir, ec);
  fs::create_directories(o.dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", o.dir, ": ", ec.message()));

  datagen::GenDatasetOptions g;
  g.out_dir = o.dir + "/ds";
  g.samples = o.samples;
  g.samples_per_shard = o.samples_per_shard;
  g.large_fraction = 0;
  g.max_megapixels = 0.3;
  g.text_tokens_median = 128;
  g.vl_text_tokens_median = 128;
  g.threads = 2;
  say(absl::StrCat("dataset: ", o.samples, " samples, ", o.samples_per_shard, " a shard"));
  RETURN_IF_ERROR(datagen::GenerateDataset(g).status());
  packer::IndexBuildOptions io;
  io.source_dir = g.out_dir;
  io.threads = 2;
  packer::IndexBuildReport report;
  const std::string index = o.dir + "/index.tutti";
  RETURN_IF_ERROR(packer::BuildIndexFile(io, index, &report, {}));
  double dataset_bytes = 0;
  for (const auto& e : fs::directory_iterator(g.out_dir, ec)) {
    if (e.path().extension() == ".tar") dataset_bytes += static_cast<double>(e.file_size(ec));
  }
  if (ec || dataset_bytes <= 0) {
    return absl::InternalError(absl::StrCat("no shards in ", g.out_dir, ": ", ec.message()));
  }
  std::vector<LoopbackRun> runs;
  for (uint32_t r : o.replications) {
    ASSIGN_OR_RETURN(LoopbackRun run, RunOnce(o, index, dataset_bytes, r));
    runs.push_back(run);
  }
  fs::remove_all(o.dir, ec);
  return runs;
}

std::string FormatLoopbackTable(const LoopbackOptions& o, const std::vector<LoopbackRun>& runs) {
  if (runs.empty()) return "";
  std::string out = absl::StrFormat(
      "loopback: %u stagers as %u nodes (stager to stager gRPC over Unix sockets, the packer "
      "on 127.0.0.1), %u ranks, post-balancing %s, one epoch: %u steps, %.0f dataset bytes\n"
      "from the stagers' counters (tutti_stager_source_bytes_total, "
      "tutti_stager_peer_bytes_total); ViT max / lower bound from the job's plans\n",
      o.nodes, o.nodes, o.nodes * o.ranks_per_node, o.post_balancing ? "on" : "off",
      static_cast<unsigned>(runs[0].steps), runs[0].dataset_bytes);
  absl::StrAppend(&out, absl::StrFormat("%-9s %15s %15s %22s %20s %8s\n", "locality",
                                        "source/dataset", "peer KB/step", "members recv/fallback",
                                        "ViT/bound mean,max", "skipped"));
  for (const LoopbackRun& r : runs) {
    absl::StrAppend(
        &out, absl::StrFormat(
                  "%-9s %15.3f %15.1f %22s %20s %8u\n",
                  r.replication == 0 ? "off" : absl::StrCat("r = ", r.replication),
                  r.source_bytes / r.dataset_bytes,
                  r.peer_received_bytes / static_cast<double>(r.steps) / 1e3,
                  absl::StrFormat("%.0f/%.0f", r.peer_received_members, r.peer_fallback_members),
                  absl::StrFormat("%.4f,%.4f", r.vit_over_bound_mean, r.vit_over_bound_max),
                  static_cast<unsigned>(r.skipped)));
  }
  return out;
}

std::string FormatLoopbackJson(const std::vector<LoopbackRun>& runs) {
  std::string out = "[";
  for (const LoopbackRun& r : runs) {
    absl::StrAppend(
        &out, out.size() > 1 ? "," : "",
        absl::StrFormat(
            "{\"replication\":%u,\"steps\":%u,\"batches\":%u,\"skipped\":%u,"
            "\"dataset_bytes\":%.0f,\"source_bytes\":%.0f,\"source_over_dataset\":%.6g,"
            "\"peer_sent_bytes\":%.0f,\"peer_received_bytes\":%.0f,\"peer_bytes_per_step\":%.6g,"
            "\"peer_received_members\":%.0f,\"peer_fallback_members\":%.0f,"
            "\"vit_over_bound_mean\":%.6g,\"vit_over_bound_max\":%.6g,\"seconds\":%.3f}",
            r.replication, static_cast<unsigned>(r.steps), static_cast<unsigned>(r.batches),
            static_cast<unsigned>(r.skipped), r.dataset_bytes, r.source_bytes,
            r.source_bytes / r.dataset_bytes, r.peer_sent_bytes, r.peer_received_bytes,
            r.peer_received_bytes / static_cast<double>(r.steps), r.peer_received_members,
            r.peer_fallback_members, r.vit_over_bound_mean, r.vit_over_bound_max, r.seconds));
  }
  return out + "]\n";
}

}  // namespace tutti::tools
