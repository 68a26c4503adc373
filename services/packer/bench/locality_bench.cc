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

}  // namespace

absl::StatusOr<LocalityBenchResult> RunLocalityBench(const LocalityBenchOptions& o) {
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  if (o.steps == 0) return absl::InvalidArgumentError("need at least one step to measure");
  EgressOptions eo = o;
  if (eo.samples == 0) {
    // The measured steps' draws and two more.
    eo.samples = uint64_t{o.world_size} * o.workload.seqs_per_rank * o.workload.seq_len / 1000 *
                 (std::max<uint32_t>(o.steps, 3) + 2);
  }
  ASSIGN_OR_RETURN(const EgressSetup setup, MakeEgressSetup(eo));
  const Index& index = *setup.index;
  const uint32_t rpn = setup.ranks_per_node;
  if (setup.today->total_steps() != 0 && setup.today->total_steps() < o.steps) {
    return absl::InvalidArgumentError("the dataset is too small for the steps; raise --samples");
  }
  const HomeStaging& homes = *setup.local->homes();
  const uint32_t W = setup.world_size;

  LocalityBenchResult r;
  const Planner today_planner(setup.today), local_planner(setup.local);
  std::vector<double> cpu, wall, cpu_today, wall_today;
  double remote = 0, items = 0, peer_bytes = 0, vit = 0, vit_today = 0;
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
    // With locality: nothing loaded locally off its home.
    const ShardHomes& h = homes.HomesAt(step);
    ForEachLoad(d, rpn, [&](uint32_t shard, uint32_t node, bool is_remote) {
      if (!is_remote && !h.IsHome(shard, node)) ++r.off_home_local_loads;
    });
    for (const PlannedImage& im : d.images) remote_images += im.remote_load ? 1 : 0;
    images += static_cast<double>(d.images.size());
    const StepLocality l = MeasureStepLocality(index, d);
    items += static_cast<double>(l.items);
    remote += static_cast<double>(l.remote_items);
    peer_bytes += static_cast<double>(l.remote_member_bytes);
    vit += d.vit.lower_bound > 0 ? d.vit.max / d.vit.lower_bound : 1;
    vit_today += t.vit.lower_bound > 0 ? t.vit.max / t.vit.lower_bound : 1;
  }
  const double n = o.steps;
  r.remote_share = items > 0 ? remote / items : 0;
  r.image_remote_share = images > 0 ? remote_images / images : 0;
  r.peer_bytes_per_step = peer_bytes / n;
  r.vit_over_bound = vit / n;
  r.vit_over_bound_today = vit_today / n;
  r.plan_cpu_ms = Median(cpu);
  r.plan_ms = Median(wall);
  r.plan_cpu_ms_today = Median(cpu_today);
  r.plan_ms_today = Median(wall_today);

  say("egress: every node's stager cache over the counted steps");
  ASSIGN_OR_RETURN(r.egress, CountEgress(setup, eo));
  return r;
}

std::string FormatLocalityTable(const LocalityBenchResult& r) {
  const EgressResult& e = r.egress;
  std::string out = absl::StrFormat(
      "W = %u ranks on %u nodes, %u shards, r = %u, %u samples a step, %.0f steps an epoch\n\n",
      e.ranks, e.nodes, e.shards, e.replication, static_cast<unsigned>(e.samples_per_step),
      e.epoch_steps);
  absl::StrAppend(&out, FormatEgressTable(e));
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
  return absl::StrFormat(
      "{%s,\"vit_over_bound\":%.6g,"
      "\"vit_over_bound_today\":%.6g,\"remote_share\":%.6g,\"image_remote_share\":%.6g,"
      "\"peer_bytes_per_step\":%.6g,\"off_home_local_loads\":%u,\"plan_cpu_ms\":%.6g,"
      "\"plan_ms\":%.6g,\"plan_cpu_ms_today\":%.6g,\"plan_ms_today\":%.6g}\n",
      FormatEgressJsonFields(r.egress), r.vit_over_bound, r.vit_over_bound_today, r.remote_share,
      r.image_remote_share, r.peer_bytes_per_step, static_cast<unsigned>(r.off_home_local_loads),
      r.plan_cpu_ms, r.plan_ms, r.plan_cpu_ms_today, r.plan_ms_today);
}

}  // namespace tutti::packer
