#include "services/packer/bench/exchange_bench.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "services/packer/bench/staging.h"
#include "services/packer/core/planner.h"
#include "services/packer/core/post_balancing/llm_ilp.h"
#include "services/packer/core/post_balancing/post_balancing.h"

namespace tutti::packer {
namespace {

double VsBound(const PhaseSummary& p) { return p.lower_bound > 0 ? p.max / p.lower_bound : 1.0; }

void FillPhases(const StepPlanData& d, ExchangeBenchRow* row) {
  row->encoder_imbalance = d.vit.imbalance;
  row->encoder_vs_bound = VsBound(d.vit);
  if (d.has_audio) {
    row->audio_imbalance = d.audio_phase.imbalance;
    row->audio_vs_bound = VsBound(d.audio_phase);
  }
  row->llm_imbalance = d.llm.imbalance;
  row->llm_vs_bound = VsBound(d.llm);
}

// The drawn split the post plan replaces: its max/mean, and against the
// same lower bound (the drawn mean equals the placed one: the same work).
void FillDrawn(const StepPlanData& d, ExchangeBenchRow* row) {
  auto vs = [](const PhaseSummary& p) {
    return p.lower_bound > 0 ? p.imbalance_before * p.mean / p.lower_bound : 1.0;
  };
  row->encoder_imbalance = d.vit.imbalance_before;
  row->encoder_vs_bound = vs(d.vit);
  if (d.has_audio) {
    row->audio_imbalance = d.audio_phase.imbalance_before;
    row->audio_vs_bound = vs(d.audio_phase);
  }
  row->llm_imbalance = d.llm.imbalance_before;
  row->llm_vs_bound = vs(d.llm);
}

// The samples drawn by the first sub_rpn ranks of the first sub_nodes nodes,
// re-numbered onto a sub_nodes x sub_rpn cluster (with restricted staging,
// those whose shard is staged on one of those nodes).
StepPlanData SubStep(const StepPlanData& in, const dispatch::ShardAvailability& av,
                     uint32_t sub_nodes, uint32_t sub_rpn, dispatch::ShardAvailability* sub_av) {
  StepPlanData out;
  out.step = in.step;
  out.seq_len = in.seq_len;
  out.world_size = sub_nodes * sub_rpn;
  out.ranks_per_node = sub_rpn;
  out.text_seqs = in.text_seqs;
  out.vl_seqs = in.vl_seqs;
  *sub_av = dispatch::ShardAvailability();
  if (!av.all()) {  // the sub-instance's nodes are the first sub_nodes
    *sub_av = dispatch::ShardAvailability::None(av.shards(), sub_nodes);
    for (uint32_t s = 0; s < av.shards(); ++s) {
      for (uint32_t n = 0; n < sub_nodes; ++n) sub_av->Set(s, n, av.Has(s, n));
    }
  }
  const uint32_t rpn = std::max<uint32_t>(1, in.ranks_per_node);
  std::vector<uint32_t> renumber(in.samples.size(), UINT32_MAX);
  for (uint32_t k = 0; k < in.samples.size(); ++k) {
    const PlannedSample& s = in.samples[k];
    const uint32_t node = s.drawn_rank / rpn, local = s.drawn_rank % rpn;
    if (node >= sub_nodes || local >= sub_rpn) continue;
    bool staged = av.all();
    for (uint32_t n = 0; n < sub_nodes && !staged; ++n) staged = av.Has(s.shard, n);
    if (!staged) continue;
    renumber[k] = static_cast<uint32_t>(out.samples.size());
    PlannedSample t = s;
    t.drawn_rank = node * sub_rpn + local;
    t.first_image = static_cast<uint32_t>(out.images.size());
    t.first_audio = static_cast<uint32_t>(out.audio.size());
    out.samples.push_back(t);
    for (uint32_t i = s.first_image; i < s.first_image + s.cost.images; ++i) {
      out.images.push_back(in.images[i]);
      out.images.back().owner = renumber[k];
    }
    for (uint32_t a = s.first_audio; a < s.first_audio + s.cost.audio; ++a) {
      out.audio.push_back(in.audio[a]);
      out.audio.back().owner = renumber[k];
    }
  }
  return out;
}

void RunGlpk(const ExchangeBenchOptions& o, const Job& job, const Planner& planner,
             const dispatch::ShardAvailability& av, ExchangeBenchRow* row) {
  StepPlanData drawn;
  if (absl::Status s = planner.Draw(o.step, &drawn); !s.ok()) {
    row->glpk_status = absl::StrCat("no result: ", s.message());
    return;
  }
  const uint32_t nodes = std::min(o.glpk_sub_nodes, job.world_size() / job.ranks_per_node());
  const uint32_t rpn = std::min(o.glpk_sub_ranks_per_node, job.ranks_per_node());
  dispatch::DispatchOptions sd = PostBalancingOptions(job.dispatcher_options());
  sd.cluster = {nodes * rpn, rpn};
  sd.cost = job.coster(drawn.stage).model().options();
  dispatch::ShardAvailability sub_av;
  const StepPlanData sub = SubStep(drawn, av, nodes, rpn, &sub_av);
  absl::StatusOr<dispatch::RearrangementInstance> inst =
      dispatch::BuildRearrangement(sub, sub_av, sd);
  if (!inst.ok()) {
    row->glpk_status = absl::StrCat("no result: ", inst.status().message());
    return;
  }
  // As Dispatch rearranges: locality within the working tolerance, then
  // balance bought back down to balance_tolerance.
  absl::StatusOr<dispatch::RearrangeResult> fast = dispatch::RearrangeLlm(
      inst->problem, sd.improvement_rounds, std::max(sd.balance_tolerance, sd.locality_slack),
      nullptr, (1 + sd.balance_tolerance) * inst->llm_lower_bound);
  if (!fast.ok()) {
    row->glpk_status = absl::StrCat("no result: ", fast.status().message());
    return;
  }
  // The same constraint for both: the fast placement's bound, or the
  // balance it bought back below it.
  const std::vector<double> fast_cost = dispatch::LlmRankCosts(inst->problem, fast->assignment);
  inst->problem.bound =
      std::min(fast->bound, std::max((1 + sd.balance_tolerance) * inst->llm_lower_bound,
                                     *std::max_element(fast_cost.begin(), fast_cost.end())));
  dispatch::IlpOptions io;
  io.time_limit_s = o.glpk_time_limit_s;
  io.start = &fast->assignment;
  absl::StatusOr<dispatch::IlpResult> ilp = dispatch::SolveLlmIlp(inst->problem, io);
  const uint64_t fast_bytes = dispatch::LlmInterNodeBytes(inst->problem, fast->assignment);
  row->glpk_fast_bytes = fast_bytes;
  if (!ilp.ok()) {
    row->glpk_status = absl::StrCat("no result: ", ilp.status().message());
    return;
  }
  if (ilp->outcome != dispatch::IlpOutcome::kOptimal) {
    row->glpk_status = ilp->outcome == dispatch::IlpOutcome::kInfeasible
                           ? "no result: infeasible"
                           : absl::StrCat("no result: ", ilp->detail);
    return;
  }
  row->glpk_optimum_bytes = ilp->bytes;
  absl::StatusOr<dispatch::LlmAssignment> balanced =
      dispatch::BalanceLlm(inst->problem, sd.improvement_rounds);
  const uint64_t oblivious =
      balanced.ok() ? dispatch::LlmInterNodeBytes(inst->problem, *balanced) : 0;
  const double denom =
      ilp->bytes > 0 ? double(ilp->bytes) : double(std::max<uint64_t>(1, oblivious));
  row->glpk_gap = (double(fast_bytes) - double(ilp->bytes)) / denom;
  row->glpk_status = absl::StrFormat("optimal (%u samples, %u ranks, %.1f s)",
                                     static_cast<unsigned>(sub.samples.size()),
                                     static_cast<unsigned>(sd.cluster.world_size), ilp->seconds);
}

// CPU time of the calling thread, in milliseconds: what the plan costs on
// one core, whatever else the machine runs.
double ThreadCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

absl::StatusOr<std::shared_ptr<const Job>> BenchJob(const ExchangeBenchOptions& o,
                                                    std::shared_ptr<const Index> index,
                                                    const SeedStepShape& shape, uint32_t W,
                                                    bool post, bool node_aware) {
  // The strategy is not used with post-balancing.
  v1::JobConfig c = SeedConfig(o.workload, shape, W, o.max_pixels, post ? "tutti" : o.pre_strategy,
                               o.open_bins, post);
  c.mutable_post_balancing()->set_padded(o.padded);
  if (o.hidden_size > 0) c.mutable_post_balancing()->set_hidden_size(o.hidden_size);
  if (o.balance_tolerance >= 0) {
    c.mutable_post_balancing()->set_balance_tolerance(o.balance_tolerance);
  }
  JobOptions jo;
  jo.node_aware = node_aware;
  return Job::Create(std::move(c), std::move(index), jo);
}

// One world size: the three rows.
absl::Status RunWorld(const ExchangeBenchOptions& o, std::shared_ptr<const Index> index, uint32_t W,
                      std::vector<ExchangeBenchRow>* rows) {
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  ASSIGN_OR_RETURN(SeedStepShape shape, SeedShape(o.workload, *index, W, o.max_pixels));
  ASSIGN_OR_RETURN(auto post_job, BenchJob(o, index, shape, W, true, true));
  ASSIGN_OR_RETURN(auto oblivious_job, BenchJob(o, index, shape, W, true, false));
  std::unique_ptr<ShardsOnNodes> staging;
  if (o.shard_nodes > 0) {
    staging = std::make_unique<ShardsOnNodes>(index->num_shards(), W / post_job->ranks_per_node(),
                                              o.shard_nodes);
  }
  const Planner post(post_job, staging.get()), oblivious(oblivious_job, staging.get());
  StepPlanData d;
  absl::Status failed;
  std::vector<double> ms, cpu_ms;
  say(absl::StrCat("W=", W, ": post-balancing x", std::max(1u, o.plan_repeats)));
  for (uint32_t k = 0; k < std::max(1u, o.plan_repeats) && failed.ok(); ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = ThreadCpuMs();
    failed = post.Plan(o.step, &d);
    cpu_ms.push_back(ThreadCpuMs() - c0);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  ExchangeBenchRow base;
  base.ranks = W;
  base.nodes = W / post_job->ranks_per_node();
  base.samples = shape.text_samples + shape.vl_samples;
  base.vl_samples = shape.vl_samples;
  base.images = failed.ok() ? static_cast<uint32_t>(d.images.size()) : 0;
  base.audio_clips = failed.ok() ? static_cast<uint32_t>(d.audio.size()) : 0;
  base.glpk_status = "not run";
  say(absl::StrCat("W=", W, ": ", base.samples, " samples (", base.vl_samples, " VL, ", base.images,
                   " images, ", base.audio_clips, " audio clips)"));

  ExchangeBenchRow none = base;
  none.mode = "none";
  if (failed.ok()) {
    FillDrawn(d, &none);
  } else {
    none.error = std::string(failed.message());
  }
  rows->push_back(none);

  say(absl::StrCat("W=", W, ": pre-balancing (", o.pre_strategy, ")"));
  ExchangeBenchRow pre = base;
  pre.mode = "pre";
  absl::StatusOr<std::shared_ptr<const Job>> pre_job = BenchJob(o, index, shape, W, false, true);
  StepPlanData pd;
  absl::Status pre_status =
      pre_job.ok() ? Planner(*pre_job, staging.get()).Plan(o.step, &pd) : pre_job.status();
  if (pre_status.ok()) {
    FillPhases(pd, &pre);
  } else {
    pre.error = std::string(pre_status.message());
  }
  rows->push_back(pre);

  ExchangeBenchRow row = base;
  row.mode = "post";
  StepPlanData od;
  if (failed.ok()) failed = oblivious.Plan(o.step, &od);
  if (!failed.ok()) {
    row.error = std::string(failed.message());
    rows->push_back(row);
    return absl::OkStatus();
  }
  std::sort(ms.begin(), ms.end());
  std::sort(cpu_ms.begin(), cpu_ms.end());
  FillPhases(d, &row);
  row.plan_ms_median = ms[ms.size() / 2];
  row.plan_cpu_ms_median = cpu_ms[cpu_ms.size() / 2];
  row.inter_node_bytes = d.inter_node_bytes + d.remote_load_bytes;
  row.inter_node_bytes_oblivious = od.inter_node_bytes + od.remote_load_bytes;
  row.exchange_bytes = d.inter_node_bytes + d.intra_node_bytes;
  row.llm_fallback = d.llm_fallback;
  if (o.transport != nullptr && *o.transport) {
    say(absl::StrCat("W=", W, ": exchange over the transport"));
    absl::StatusOr<TransportBenchResult> t = (*o.transport)(*post_job, d);
    if (t.ok()) {
      row.client_vs_bare_throughput = t->client_vs_bare_throughput;
      row.client_exchange_ms = t->client_seconds * 1e3;
      row.bare_exchange_ms = t->bare_seconds * 1e3;
      row.exchange_bytes_per_rank = t->bytes_per_rank_max;
    } else {
      row.error = absl::StrCat("transport: ", t.status().message());
    }
  }
  if (W <= o.glpk_max_world) {
    say(absl::StrCat("W=", W, ": GLPK on a sub-instance"));
    const dispatch::ShardAvailability av =
        staging ? staging->At(o.step) : dispatch::ShardAvailability();
    RunGlpk(o, *post_job, post, av, &row);
  }
  rows->push_back(row);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<ExchangeBenchRow>> RunExchangeBench(const ExchangeBenchOptions& o) {
  if (o.world_sizes.empty()) return absl::InvalidArgumentError("no world size to run");
  const uint32_t max_w = *std::max_element(o.world_sizes.begin(), o.world_sizes.end());
  for (uint32_t W : o.world_sizes) {
    const uint32_t rpn = std::min(W, o.workload.ranks_per_node);
    if (W == 0 || rpn == 0 || W % rpn != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("world size ", W, " is not a multiple of ", o.workload.ranks_per_node,
                       " ranks per node; pick world sizes that fill whole nodes"));
    }
  }
  const uint64_t samples =
      o.samples > 0 ? o.samples
                    : std::max<uint64_t>(50000, uint64_t{max_w} * o.workload.seqs_per_rank *
                                                    o.workload.seq_len / 1400 * 6);
  if (o.progress) o.progress(absl::StrCat("dataset: ", samples, " synthetic samples"));
  ASSIGN_OR_RETURN(std::shared_ptr<const Index> index, MakeSeedIndex(o.workload, samples));
  std::vector<ExchangeBenchRow> rows;
  for (uint32_t W : o.world_sizes) RETURN_IF_ERROR(RunWorld(o, index, W, &rows));
  return rows;
}

std::string FormatExchangeTable(const std::vector<ExchangeBenchRow>& rows) {
  bool transport = false;
  for (const auto& r : rows) transport |= r.client_vs_bare_throughput.has_value();
  std::string out =
      absl::StrFormat("%-5s %6s %8s %8s %8s %8s %8s %8s %12s %12s %7s %9s %9s %9s", "mode", "ranks",
                      "vit_imb", "vit/lb", "aud_imb", "aud/lb", "llm_imb", "llm/lb", "inter_MB",
                      "oblivious_MB", "ratio", "glpk_gap", "plan_ms", "cpu_ms");
  if (transport) {
    out +=
        absl::StrFormat(" %11s %10s %10s %11s", "MB/rank", "client_ms", "bare_ms", "client/bare");
  }
  out += "\n";
  for (const auto& r : rows) {
    if (!r.error.empty()) {
      out += absl::StrFormat("%-5s %6u failed: %s\n", r.mode, r.ranks, r.error);
      continue;
    }
    const bool post = r.mode == "post";
    auto mb = [](uint64_t b) { return absl::StrFormat("%.1f", b / 1e6); };
    auto opt4 = [](const std::optional<double>& v) {
      return v ? absl::StrFormat("%.4f", *v) : std::string("-");
    };
    out += absl::StrFormat(
        "%-5s %6u %8.4f %8.4f %8s %8s %8.4f %8.4f %12s %12s %7s %9s %9s %9s\n", r.mode, r.ranks,
        r.encoder_imbalance, r.encoder_vs_bound, opt4(r.audio_imbalance), opt4(r.audio_vs_bound),
        r.llm_imbalance, r.llm_vs_bound, post ? mb(r.inter_node_bytes) : "-",
        post ? mb(r.inter_node_bytes_oblivious) : "-",
        post && r.inter_node_bytes_oblivious > 0
            ? absl::StrFormat("%.3f", double(r.inter_node_bytes) / r.inter_node_bytes_oblivious)
            : "-",
        r.glpk_gap ? absl::StrFormat("%.4f", *r.glpk_gap) : "-",
        r.plan_ms_median ? absl::StrFormat("%.1f", *r.plan_ms_median) : "-",
        r.plan_cpu_ms_median ? absl::StrFormat("%.1f", *r.plan_cpu_ms_median) : "-");
    if (transport) {
      out.pop_back();  // the newline
      auto opt = [](const std::optional<double>& v, const absl::FormatSpec<double>& f) {
        return v ? absl::StrFormat(f, *v) : std::string("-");
      };
      out += absl::StrFormat(" %11s %10s %10s %11s\n",
                             r.exchange_bytes_per_rank
                                 ? absl::StrFormat("%.2f", *r.exchange_bytes_per_rank / 1e6)
                                 : "-",
                             opt(r.client_exchange_ms, "%.3f"), opt(r.bare_exchange_ms, "%.3f"),
                             opt(r.client_vs_bare_throughput, "%.4f"));
    }
  }
  return out;
}

std::string FormatExchangeJson(const std::vector<ExchangeBenchRow>& rows) {
  auto opt = [](const std::optional<double>& v) {
    return v ? absl::StrFormat("%.6g", *v) : std::string("null");
  };
  auto optu = [](const std::optional<uint64_t>& v) {
    return v ? absl::StrCat(*v) : std::string("null");
  };
  std::string out = "[\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    auto quote = [](const std::string& s) {
      std::string q = "\"";
      for (char ch : s) {
        if (ch == '"' || ch == '\\') q += '\\';
        q += ch;
      }
      return q + "\"";
    };
    out += absl::StrFormat(
        "  {\"mode\": \"%s\", \"ranks\": %u, \"nodes\": %u, \"samples\": %u, \"vl_samples\": %u, "
        "\"images\": %u, \"audio_clips\": %u, \"encoder_imbalance\": %.6g, "
        "\"encoder_imbalance_vs_bound\": %.6g, \"audio_imbalance\": %s, "
        "\"audio_imbalance_vs_bound\": %s, "
        "\"llm_imbalance\": %.6g, "
        "\"llm_imbalance_vs_bound\": %.6g, \"inter_node_bytes\": %u, "
        "\"inter_node_bytes_oblivious\": %u, \"exchange_bytes\": %u, \"glpk_gap\": %s, "
        "\"glpk_optimum_bytes\": %s, \"glpk_fast_bytes\": %s, \"glpk_status\": %s, "
        "\"plan_ms_median\": %s, \"plan_cpu_ms_median\": %s, "
        "\"client_vs_bare_throughput\": %s, \"client_exchange_ms\": %s, "
        "\"bare_exchange_ms\": %s, \"exchange_bytes_per_rank\": %s, \"llm_fallback\": %s, "
        "\"error\": %s}%s\n",
        r.mode, r.ranks, r.nodes, r.samples, r.vl_samples, r.images, r.audio_clips,
        r.encoder_imbalance, r.encoder_vs_bound, opt(r.audio_imbalance), opt(r.audio_vs_bound),
        r.llm_imbalance, r.llm_vs_bound, r.inter_node_bytes, r.inter_node_bytes_oblivious,
        r.exchange_bytes, opt(r.glpk_gap), optu(r.glpk_optimum_bytes), optu(r.glpk_fast_bytes),
        quote(r.glpk_status), opt(r.plan_ms_median), opt(r.plan_cpu_ms_median),
        opt(r.client_vs_bare_throughput), opt(r.client_exchange_ms), opt(r.bare_exchange_ms),
        optu(r.exchange_bytes_per_rank), r.llm_fallback ? "true" : "false",
        r.error.empty() ? std::string("null") : quote(r.error), i + 1 < rows.size() ? "," : "");
  }
  out += "]\n";
  return out;
}

}  // namespace tutti::packer
