#include "services/packer/bench/locality_bench.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/shard_homes.h"
#include "common/status.h"
#include "services/packer/core/home_staging.h"
#include "services/packer/core/job.h"
#include "services/packer/core/planner.h"

namespace tutti::packer {
namespace {

double ThreadCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The node each load item of a planned step is loaded on, with its shard.
template <typename Fn>
void ForEachLoad(const StepPlanData& d, uint32_t rpn, Fn&& fn) {
  for (const PlannedSample& ps : d.samples) fn(ps.shard, ps.rank / rpn, ps.text_remote);
  for (const PlannedImage& im : d.images) {
    fn(d.samples[im.owner].shard, im.enc_rank / rpn, im.remote_load);
  }
  for (const PlannedAudio& au : d.audio) {
    fn(d.samples[au.owner].shard, au.enc_rank / rpn, au.remote_load);
  }
}

// Today's source bytes per node per epoch, in shards: `steps` steps, each
// touching `touched` distinct shards of `shards` uniformly at random, with a
// cache of `cached` shards. A touched shard is a hit with probability
// (shards held) / shards.
double TodayShardReads(double shards, double touched, double steps, double cached) {
  double held = 0, reads = 0;
  const double whole = std::floor(steps);
  for (double t = 0; t < whole + 1; ++t) {
    const double part = t < whole ? 1.0 : steps - whole;
    if (part <= 0) break;
    const double misses = part * touched * (1 - held / shards);
    reads += misses;
    held = std::min(cached, held + misses);
  }
  return reads;
}

}  // namespace

absl::StatusOr<LocalityBenchResult> RunLocalityBench(const LocalityBenchOptions& o) {
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  const uint32_t W = o.world_size;
  const uint32_t rpn = std::min(W, o.workload.ranks_per_node);
  if (W == 0 || rpn == 0 || W % rpn != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", W, " is not a multiple of ", rpn, " ranks per node"));
  }
  if (o.shard_bytes == 0 || o.dataset_bytes < o.shard_bytes) {
    return absl::InvalidArgumentError("the dataset must hold at least one shard");
  }
  if (o.steps == 0 || o.replication == 0 || o.cache_fractions.empty()) {
    return absl::InvalidArgumentError("need at least one step, replication and cache size");
  }
  const uint64_t shards = (o.dataset_bytes + o.shard_bytes - 1) / o.shard_bytes;
  const uint64_t wanted = o.samples > 0 ? o.samples
                                        : uint64_t{W} * o.workload.seqs_per_rank *
                                              o.workload.seq_len / 1000 * (o.steps + 2);
  SeedWorkloadOptions wl = o.workload;
  wl.ranks_per_node = rpn;
  wl.samples_per_shard = static_cast<uint32_t>(std::max<uint64_t>(1, wanted / shards));
  const uint64_t samples = uint64_t{wl.samples_per_shard} * shards;
  say(absl::StrCat("dataset: ", samples, " synthetic samples in ", shards, " shards"));
  ASSIGN_OR_RETURN(std::shared_ptr<const Index> index, MakeSeedIndex(wl, samples));
  ASSIGN_OR_RETURN(SeedStepShape shape, SeedShape(wl, *index, W, o.max_pixels));

  // The bytes of the members a sample holds, on average: what the dataset's
  // size in samples is computed from.
  double member_bytes = 0;
  for (uint32_t s = 0; s < index->num_samples(); ++s) {
    member_bytes += index->text_size(s);
    for (uint32_t j = index->media_begin(s); j < index->media_end(s); ++j) {
      member_bytes += index->media(j).size;
    }
  }
  const double bytes_per_sample = member_bytes / std::max<uint32_t>(1, index->num_samples());

  v1::JobConfig today = SeedConfig(wl, shape, W, o.max_pixels, "tutti", 6, true);
  if (o.balance_tolerance >= 0) {
    today.mutable_post_balancing()->set_balance_tolerance(o.balance_tolerance);
  }
  // Capacities are fractions of the index's own bytes (every synthetic shard
  // has one size, so a fraction of the dataset is the same number of shards).
  const double index_bytes = static_cast<double>(index->dataset_bytes());
  // The smallest cache that holds the homes plans the locality job (the
  // homes differ only where a capacity binds).
  std::vector<ShardKey> keys;
  for (const IndexShard& s : index->shards()) keys.push_back({s.name, s.size});
  auto homes_for = [&](double f) {
    ShardHomesOptions ho;
    ho.replication = o.replication;
    ho.node_capacity_bytes = static_cast<uint64_t>(std::ceil(f * index_bytes));
    ho.seed = today.seed();
    return ShardHomes::Assign(keys, W / rpn, ho);
  };
  double smallest = 0;
  for (double f : o.cache_fractions) {
    if ((smallest == 0 || f < smallest) && homes_for(f).ok()) smallest = f;
  }
  if (smallest == 0) {
    const double largest = *std::max_element(o.cache_fractions.begin(), o.cache_fractions.end());
    return absl::ResourceExhaustedError(absl::StrCat("no cache size given holds the homes: ",
                                                     homes_for(largest).status().message()));
  }
  v1::JobConfig local = today;
  local.mutable_locality()->set_home_replication(o.replication);
  local.mutable_locality()->set_node_cache_bytes(
      static_cast<uint64_t>(std::ceil(smallest * index_bytes)));
  say("jobs: post-balancing with and without locality");
  ASSIGN_OR_RETURN(std::shared_ptr<const Job> today_job, Job::Create(today, index));
  ASSIGN_OR_RETURN(std::shared_ptr<const Job> local_job, Job::Create(local, index));
  if (today_job->total_steps() != 0 && today_job->total_steps() < o.steps) {
    return absl::InvalidArgumentError("the dataset is too small for the steps; raise --samples");
  }
  const HomeStaging& homes = *local_job->homes();

  LocalityBenchResult r;
  r.ranks = W;
  r.nodes = W / rpn;
  r.shards = index->num_shards();
  r.replication = homes.HomesAt(0).replication();
  r.samples_per_step = shape.text_samples + shape.vl_samples;
  r.index_samples = samples;
  r.epoch_steps = o.dataset_bytes / bytes_per_sample / static_cast<double>(r.samples_per_step);

  const Planner today_planner(today_job), local_planner(local_job);
  std::vector<double> cpu, wall, cpu_today, wall_today;
  double touched = 0, remote = 0, items = 0, peer_bytes = 0, vit = 0, vit_today = 0;
  double images = 0, remote_images = 0;
  for (uint64_t step = 0; step < o.steps; ++step) {
    say(absl::StrCat("step ", step, ": planning W=", W, " with and without locality"));
    StepPlanData d, t;
    auto plan = [&](const Planner& p, StepPlanData* out, std::vector<double>* c,
                    std::vector<double>* w) {
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = ThreadCpuMs();
      absl::Status s = p.Plan(step, out);
      c->push_back(ThreadCpuMs() - c0);
      w->push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      return s;
    };
    RETURN_IF_ERROR(plan(local_planner, &d, &cpu, &wall));
    RETURN_IF_ERROR(plan(today_planner, &t, &cpu_today, &wall_today));
    // Today: the distinct shards each node's plans name.
    std::vector<absl::flat_hash_set<uint32_t>> per_node(r.nodes);
    ForEachLoad(t, rpn, [&](uint32_t shard, uint32_t node, bool) { per_node[node].insert(shard); });
    double sum = 0;
    for (const auto& s : per_node) sum += static_cast<double>(s.size());
    touched += sum / r.nodes;
    // With locality: nothing loaded locally off its home.
    const ShardHomes& h = homes.HomesAt(step);
    ForEachLoad(d, rpn, [&](uint32_t shard, uint32_t node, bool is_remote) {
      if (!is_remote && !h.IsHome(shard, node)) ++r.off_home_local_loads;
    });
    for (const PlannedImage& im : d.images) remote_images += im.remote_load ? 1 : 0;
    images += static_cast<double>(d.images.size());
    const StepLocality l = MeasureStepLocality(*index, d);
    items += static_cast<double>(l.items);
    remote += static_cast<double>(l.remote_items);
    peer_bytes += static_cast<double>(l.remote_member_bytes);
    vit += d.vit.lower_bound > 0 ? d.vit.max / d.vit.lower_bound : 1;
    vit_today += t.vit.lower_bound > 0 ? t.vit.max / t.vit.lower_bound : 1;
  }
  const double n = o.steps;
  r.shards_per_node_step = touched / n;
  r.remote_share = items > 0 ? remote / items : 0;
  r.image_remote_share = images > 0 ? remote_images / images : 0;
  r.peer_bytes_per_step = peer_bytes / n;
  r.vit_over_bound = vit / n;
  r.vit_over_bound_today = vit_today / n;
  r.plan_cpu_ms = Median(cpu);
  r.plan_ms = Median(wall);
  r.plan_cpu_ms_today = Median(cpu_today);
  r.plan_ms_today = Median(wall_today);

  // What the homes hold, as a share of the index's bytes, scaled to the
  // dataset: each home stages each of its shards once an epoch.
  for (double f : o.cache_fractions) {
    LocalityBenchRow row;
    row.cache_fraction = f;
    row.cache_bytes_per_node = f * static_cast<double>(o.dataset_bytes);
    row.limit_bytes = static_cast<double>(r.replication) * static_cast<double>(o.dataset_bytes);
    absl::StatusOr<ShardHomes> hs = homes_for(f);
    if (hs.ok()) {
      double held = 0;
      for (uint32_t node = 0; node < r.nodes; ++node)
        held += static_cast<double>(hs->BytesOf(node));
      row.nfs_locality_bytes = held / index_bytes * static_cast<double>(o.dataset_bytes);
    } else {
      row.error = std::string(hs.status().message());
    }
    const double reads = TodayShardReads(static_cast<double>(shards), r.shards_per_node_step,
                                         r.epoch_steps, f * static_cast<double>(shards));
    row.nfs_today_bytes = reads * r.nodes * static_cast<double>(o.shard_bytes);
    r.rows.push_back(row);
  }
  return r;
}

std::string FormatLocalityTable(const LocalityBenchResult& r) {
  std::string out = absl::StrFormat(
      "W = %u ranks on %u nodes, %u shards, r = %u, %u samples a step, %.0f steps an epoch\n"
      "today each node's plans name %.0f distinct shards a step\n\n",
      r.ranks, r.nodes, r.shards, r.replication, r.samples_per_step, r.epoch_steps,
      r.shards_per_node_step);
  absl::StrAppend(&out, absl::StrFormat("%-8s %14s %16s %16s %12s %12s\n", "cache", "cache/node",
                                        "NFS today", "NFS locality", "today/rD", "locality/rD"));
  for (const LocalityBenchRow& row : r.rows) {
    if (!row.error.empty()) {
      absl::StrAppend(&out, absl::StrFormat("%-8.4g %12.1f TB %13.1f TB  locality refused: %s\n",
                                            row.cache_fraction, row.cache_bytes_per_node / 1e12,
                                            row.nfs_today_bytes / 1e12, row.error));
      continue;
    }
    absl::StrAppend(&out, absl::StrFormat("%-8.4g %12.1f TB %13.1f TB %13.1f TB %12.1f %12.3f\n",
                                          row.cache_fraction, row.cache_bytes_per_node / 1e12,
                                          row.nfs_today_bytes / 1e12, row.nfs_locality_bytes / 1e12,
                                          row.nfs_today_bytes / row.limit_bytes,
                                          row.nfs_locality_bytes / row.limit_bytes));
  }
  absl::StrAppend(
      &out,
      absl::StrFormat(
          "\nViT max / lower bound: %.4f with locality, %.4f today\n"
          "inputs remote with locality: %.1f%% (of the images %.1f%%), member bytes stager to "
          "stager: %.2f GB a step\n"
          "inputs loaded locally off their home node: %u\n"
          "plan time (median, one thread): %.1f ms CPU (%.1f ms wall) with locality, "
          "%.1f ms CPU (%.1f ms wall) today\n",
          r.vit_over_bound, r.vit_over_bound_today, 100 * r.remote_share,
          100 * r.image_remote_share, r.peer_bytes_per_step / 1e9,
          static_cast<unsigned>(r.off_home_local_loads), r.plan_cpu_ms, r.plan_ms,
          r.plan_cpu_ms_today, r.plan_ms_today));
  return out;
}

std::string FormatLocalityJson(const LocalityBenchResult& r) {
  std::string rows;
  for (const LocalityBenchRow& row : r.rows) {
    absl::StrAppend(
        &rows, rows.empty() ? "" : ",",
        absl::StrFormat("{\"cache_fraction\":%.6g,\"cache_bytes_per_node\":%.6g,"
                        "\"nfs_today_bytes\":%.6g,\"nfs_locality_bytes\":%.6g,"
                        "\"limit_bytes\":%.6g,\"error\":\"%s\"}",
                        row.cache_fraction, row.cache_bytes_per_node, row.nfs_today_bytes,
                        row.nfs_locality_bytes, row.limit_bytes, row.error));
  }
  return absl::StrFormat(
      "{\"ranks\":%u,\"nodes\":%u,\"shards\":%u,\"replication\":%u,\"samples_per_step\":%u,"
      "\"epoch_steps\":%.6g,\"shards_per_node_step_today\":%.6g,\"vit_over_bound\":%.6g,"
      "\"vit_over_bound_today\":%.6g,\"remote_share\":%.6g,\"image_remote_share\":%.6g,\"peer_"
      "bytes_per_step\":%.6g,"
      "\"off_home_local_loads\":%u,\"plan_cpu_ms\":%.6g,\"plan_ms\":%.6g,"
      "\"plan_cpu_ms_today\":%.6g,\"plan_ms_today\":%.6g,\"rows\":[%s]}\n",
      r.ranks, r.nodes, r.shards, r.replication, static_cast<unsigned>(r.samples_per_step),
      r.epoch_steps, r.shards_per_node_step, r.vit_over_bound, r.vit_over_bound_today,
      r.remote_share, r.image_remote_share, r.peer_bytes_per_step,
      static_cast<unsigned>(r.off_home_local_loads), r.plan_cpu_ms, r.plan_ms, r.plan_cpu_ms_today,
      r.plan_ms_today, rows);
}

}  // namespace tutti::packer
