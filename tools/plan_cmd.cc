// `tutti plan`: computes step plans locally (the same planning core as
// tutti-packerd) and prints a summary, the plan itself, or its hash.
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "services/packer/core/cost_schedule.h"
#include "services/packer/core/planner.h"
#include "services/packer/cost_fit_record.h"
#include "services/packer/load_job.h"
#include "services/packer/plan_proto.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/locality_replay.h"
#include "tools/mixture_report.h"
#include "tools/plan_cmd_check.h"

namespace tutti::tools {
namespace {

void PrintSummary(const packer::Job& job, const packer::StepPlanData& d, const v1::StepPlan& plan,
                  double plan_ms) {
  std::printf(
      "step %llu  epoch %llu  curriculum[%u]: max_pixels %llu, seq_len %u  strategy %s  "
      "(%.2f ms)\n",
      static_cast<unsigned long long>(d.step), static_cast<unsigned long long>(d.epoch), d.stage,
      static_cast<unsigned long long>(d.max_pixels), d.seq_len, job.plan_strategy().c_str(),
      plan_ms);
  std::printf("  %zu samples (%zu text-only, %zu VL), %zu images, %zu audio clips, %d shards\n",
              d.samples.size(), d.text_items.size(), d.vl_items.size(), d.images.size(),
              d.audio.size(), plan.shards_size());
  for (const auto& ph : plan.stats().phases()) {
    std::printf("  %-5s max/mean %.3f (drawn split %.3f), lower bound %.3f of mean\n",
                ph.phase().c_str(), ph.imbalance(), ph.imbalance_before(),
                ph.mean() > 0 ? ph.lower_bound() / ph.mean() : 1.0);
  }
  if (d.remote_load_bytes > 0) {
    std::printf("  load exchange: %llu bytes of inputs from other nodes\n",
                static_cast<unsigned long long>(d.remote_load_bytes));
  }
  std::printf("  exchange: %llu inter-node bytes, %llu intra-node bytes\n",
              static_cast<unsigned long long>(d.inter_node_bytes),
              static_cast<unsigned long long>(d.intra_node_bytes));
  std::printf("  %5s %5s %9s %12s %12s %8s %7s %7s %7s\n", "rank", "node", "samples", "llm_tokens",
              "llm_cost", "images", "vit", "chunks", "send_MB");
  for (const auto& r : plan.ranks()) {
    int chunks = 0;
    for (const auto& e : r.encoders()) chunks += e.chunks_size();
    std::printf("  %5u %5u %9u %12llu %12.0f %8u %7.0f %7d %7.2f\n", r.rank(), r.node(),
                r.cost().samples(), static_cast<unsigned long long>(r.cost().llm_tokens()),
                r.cost().llm(), r.cost().images(), r.cost().vit(), chunks,
                r.exchange().send_bytes() / 1e6);
  }
}

int RunPlan(int argc, char** argv) {
  std::string config, index, ranks_text, format = "summary", post_balancing, cost_fits;
  LocalityReplayFlags replay;
  uint64_t step = 0, steps = 1;
  uint32_t world_size = 0;
  bool check = false, quiet = false, summary_only = false;
  Cli cli("tutti plan --config JOB.textproto [--index FILE] [--step N] [options]",
          "Computes the plan of one or more steps with the packer's planning core (the same\n"
          "plans tutti-packerd serves) and prints a per-rank summary, the StepPlan as text or\n"
          "JSON, or its identity hash (equal hashes = byte-identical plans). With --check, checks\n"
          "every plan of the steps against what the job alone (config and index) says it must\n"
          "be: the draw (each sample exactly once), every sample's tokens and costs, seq_len and\n"
          "img_cap in every sequence, the encoder and exchange lists, and the ViT and LLM\n"
          "imbalance figures the packer reports; prints a table and exits 1 on any violation or\n"
          "step the planner refuses. With --cost-fits, plans each step with the online cost fit\n"
          "in force at it (tutti-packerd --cost_fit_record), as the packer planned it. With\n"
          "--locality-record (and --node-removals), plans each step with the shard homes in\n"
          "force at it after the node changes the packer recorded (tutti-packerd\n"
          "--locality_record and --node_removals), as the packer planned it.");
  cli.Flag("config", &config, "job config (text tutti.v1.JobConfig)");
  cli.Flag("index", &index, "index file; overrides the config's index_path");
  cli.Flag("step", &step, "first step to plan");
  cli.Flag("steps", &steps, "how many consecutive steps", 1, 1000000);
  cli.Flag("ranks", &ranks_text, "comma-separated ranks to include (empty: all)");
  cli.Flag("format", &format, "summary, text, json or hash");
  cli.Flag("check", &check, "check every plan of the steps (a table; exit 1 on any violation)");
  cli.Flag("quiet", &quiet, "with --check: print only the failing steps and the summary");
  cli.Flag("summary", &summary_only,
           "print only the summary over the steps (the realised mixture per source against its "
           "target, per stage), not each step's table");
  cli.Flag("world-size", &world_size, "plan at this world size instead of the config's");
  cli.Flag("post-balancing", &post_balancing,
           "on or off: plan with batch post-balancing on or off instead of as the config says");
  cli.Flag("cost-fits", &cost_fits,
           "the job's cost fit record (tutti-packerd --cost_fit_record): plan with its fits");
  replay.Register(&cli);
  int rc = 0;
  if (!cli.Parse(argc, argv, &rc)) return rc;
  if (check && !cost_fits.empty()) {
    std::fprintf(stderr,
                 "tutti plan: --check checks plans against the job's configured costs; it does "
                 "not take --cost-fits\n");
    return 2;
  }
  if (check && !replay.record.empty()) {
    std::fprintf(stderr,
                 "tutti plan: --check checks plans against the job's configured homes; it does "
                 "not take --locality-record\n");
    return 2;
  }
  packer::JobOptions job_options;
  if (absl::Status s = replay.AddTo(&job_options); !s.ok()) {
    std::fprintf(stderr, "tutti plan: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (format != "summary" && format != "text" && format != "json" && format != "hash") {
    std::fprintf(stderr, "tutti plan: --format '%s' is unknown; use summary, text, json or hash\n",
                 format.c_str());
    return 2;
  }
  std::vector<uint32_t> ranks;
  for (absl::string_view part : absl::StrSplit(ranks_text, ',', absl::SkipEmpty())) {
    uint32_t r = 0;
    if (!absl::SimpleAtoi(part, &r)) {
      std::fprintf(stderr, "tutti plan: --ranks '%s' is not a list of ranks like 0,1,2\n",
                   ranks_text.c_str());
      return 2;
    }
    ranks.push_back(r);
  }
  if (!post_balancing.empty() && post_balancing != "on" && post_balancing != "off") {
    std::fprintf(stderr, "tutti plan: --post-balancing '%s' must be on or off\n",
                 post_balancing.c_str());
    return 2;
  }
  auto edit = [&](v1::JobConfig* c) {
    if (world_size > 0) {
      c->set_world_size(world_size);
      if (c->ranks_per_node() > world_size) c->clear_ranks_per_node();
    }
    if (!post_balancing.empty()) {
      c->mutable_post_balancing()->set_enabled(post_balancing == "on");
    }
  };
  auto job = packer::LoadJob(config, index, job_options, edit);
  if (!job.ok()) {
    std::fprintf(stderr, "tutti plan: %s\n", std::string(job.status().message()).c_str());
    return 1;
  }
  if (check) {
    const PlanCheckSummary summary = CheckSteps(*job, step, steps);
    std::fputs(FormatPlanCheck(**job, summary, !quiet).c_str(), stdout);
    return summary.ok() ? 0 : 1;
  }
  // The fits in force by step, as the packer that wrote the record planned
  // with them (none: the config's constants at every step).
  std::optional<packer::CostSchedule> schedule;
  if (!cost_fits.empty()) {
    if (FILE* f = std::fopen(cost_fits.c_str(), "r")) {
      std::fclose(f);
    } else {
      std::fprintf(stderr,
                   "tutti plan: --cost-fits %s cannot be read; give the file "
                   "tutti-packerd --cost_fit_record wrote\n",
                   cost_fits.c_str());
      return 1;
    }
    auto record = packer::ReadCostFitRecord(cost_fits, (*job)->fingerprint());
    if (!record.ok()) {
      std::fprintf(stderr, "tutti plan: %s\n", std::string(record.status().message()).c_str());
      return 1;
    }
    schedule.emplace(record->fits, record->planned_through);
  }
  // The homes by step after the node changes the packer recorded (none:
  // the job's homes under --node-removals at every step).
  auto locality = replay.Load(*job, job_options);
  if (!locality.ok()) {
    std::fprintf(stderr, "tutti plan: %s\n", std::string(locality.status().message()).c_str());
    return 1;
  }
  packer::Planner planner(*job, locality->get(), schedule ? &*schedule : nullptr);
  packer::StepPlanData data;
  v1::StepPlan plan;
  MixtureReport mixture(**job);
  const uint64_t end = (*job)->total_steps();  // 0: no end
  for (uint64_t s = step; s < step + steps; ++s) {
    if (end > 0 && s >= end && s > step) {
      // Asked past the job's end: the steps there are were printed.
      std::fprintf(stderr,
                   "tutti plan: the job ends after step %llu (%llu steps); planned %llu of "
                   "the %llu steps asked for\n",
                   static_cast<unsigned long long>(end - 1), static_cast<unsigned long long>(end),
                   static_cast<unsigned long long>(s - step),
                   static_cast<unsigned long long>(steps));
      break;
    }
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status status = planner.Plan(s, &data);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (status.ok()) status = packer::BuildStepPlan(**job, data, ranks, &plan);
    if (!status.ok()) {
      std::fprintf(stderr, "tutti plan: %s\n", std::string(status.message()).c_str());
      return 1;
    }
    plan.mutable_stats()->set_plan_seconds(ms / 1e3);
    if (format == "hash") {
      std::printf("step %llu %s\n", static_cast<unsigned long long>(s),
                  packer::PlanHash(&plan).c_str());
    } else if (format == "text") {
      std::string out;
      google::protobuf::TextFormat::PrintToString(plan, &out);
      std::fwrite(out.data(), 1, out.size(), stdout);
    } else if (format == "json") {
      std::string out;
      google::protobuf::util::JsonPrintOptions jo;
      jo.add_whitespace = true;
      (void)google::protobuf::util::MessageToJsonString(plan, &out, jo);
      std::printf("%s\n", out.c_str());
    } else {
      if (!summary_only) PrintSummary(**job, data, plan, ms);
      mixture.Add(data);
    }
  }
  if (format == "summary") std::fputs(mixture.Table().c_str(), stdout);
  return 0;
}

}  // namespace
}  // namespace tutti::tools

TUTTI_COMMAND("plan", "compute and print step plans (summary, text, json or hash)",
              tutti::tools::RunPlan);
