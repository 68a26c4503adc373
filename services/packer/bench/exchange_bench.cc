#include "services/packer/bench/exchange_bench.h"

#include <time.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "services/packer/core/post_balancing/llm_ilp.h"
#include "services/packer/core/post_balancing/move_lists.h"
#include "services/packer/core/post_balancing/post_balancing.h"

namespace tutti::dispatch {
namespace {

const PhaseStats* Find(const std::vector<PhaseStats>& phases, const char* name) {
  for (const PhaseStats& p : phases) {
    if (p.phase == name) return &p;
  }
  return nullptr;
}

void FillPhases(const std::vector<PhaseStats>& phases, ExchangeBenchRow* row) {
  if (const PhaseStats* p = Find(phases, "vit")) {
    row->encoder_imbalance = p->imbalance;
    row->encoder_vs_bound = p->imbalance_vs_bound;
  }
  if (const PhaseStats* p = Find(phases, "audio")) {
    row->audio_imbalance = p->imbalance;
    row->audio_vs_bound = p->imbalance_vs_bound;
  }
  if (const PhaseStats* p = Find(phases, "llm")) {
    row->llm_imbalance = p->imbalance;
    row->llm_vs_bound = p->imbalance_vs_bound;
  }
}

// The samples drawn by the first sub_rpn ranks of the first sub_nodes nodes,
// re-numbered onto a sub_nodes x sub_rpn cluster (with restricted staging,
// those whose shard is staged on one of those nodes).
DispatchInput SubInstance(const DispatchInput& in, const ClusterShape& c, uint32_t sub_nodes,
                          uint32_t sub_rpn) {
  DispatchInput out;
  if (!in.availability.all()) {  // the sub-instance's nodes are the first sub_nodes
    const ShardAvailability& a = in.availability;
    out.availability = ShardAvailability::None(a.shards(), sub_nodes);
    for (uint32_t s = 0; s < a.shards(); ++s) {
      for (uint32_t n = 0; n < sub_nodes; ++n) out.availability.Set(s, n, a.Has(s, n));
    }
  }
  for (const Sample& s : in.samples) {
    const uint32_t node = c.node_of(s.drawn_rank), local = s.drawn_rank % c.ranks_per_node;
    if (node >= sub_nodes || local >= sub_rpn) continue;
    // Samples whose shard no node of the sub-cluster stages are left out.
    bool staged = in.availability.all();
    for (uint32_t n = 0; n < sub_nodes && !staged; ++n) staged = in.availability.Has(s.shard, n);
    if (!staged) continue;
    Sample t = s;
    t.drawn_rank = node * sub_rpn + local;
    out.samples.push_back(std::move(t));
  }
  return out;
}

void RunGlpk(const ExchangeBenchOptions& o, const Workload& w, const DispatchOptions& d,
             ExchangeBenchRow* row) {
  const uint32_t nodes = std::min(o.glpk_sub_nodes, d.cluster.nodes());
  const uint32_t rpn = std::min(o.glpk_sub_ranks_per_node, d.cluster.ranks_per_node);
  DispatchOptions sd = d;
  sd.cluster = {nodes * rpn, rpn};
  const DispatchInput sub = SubInstance(w.input, d.cluster, nodes, rpn);
  absl::StatusOr<RearrangementInstance> inst = BuildRearrangement(sub, sd);
  if (!inst.ok()) {
    row->glpk_status = absl::StrCat("no result: ", inst.status().message());
    return;
  }
  absl::StatusOr<RearrangeResult> fast =
      RearrangeLlm(inst->problem, sd.improvement_rounds, sd.balance_tolerance);
  if (!fast.ok()) {
    row->glpk_status = absl::StrCat("no result: ", fast.status().message());
    return;
  }
  inst->problem.bound = fast->bound;  // the same constraint for both
  IlpOptions io;
  io.time_limit_s = o.glpk_time_limit_s;
  io.start = &fast->assignment;
  absl::StatusOr<IlpResult> ilp = SolveLlmIlp(inst->problem, io);
  const uint64_t fast_bytes = LlmInterNodeBytes(inst->problem, fast->assignment);
  row->glpk_fast_bytes = fast_bytes;
  if (!ilp.ok()) {
    row->glpk_status = absl::StrCat("no result: ", ilp.status().message());
    return;
  }
  if (ilp->outcome != IlpOutcome::kOptimal) {
    row->glpk_status = ilp->outcome == IlpOutcome::kInfeasible
                           ? "no result: infeasible"
                           : absl::StrCat("no result: ", ilp->detail);
    return;
  }
  row->glpk_optimum_bytes = ilp->bytes;
  absl::StatusOr<LlmAssignment> balanced = BalanceLlm(inst->problem, sd.improvement_rounds);
  const uint64_t oblivious = balanced.ok() ? LlmInterNodeBytes(inst->problem, *balanced) : 0;
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

}  // namespace

absl::StatusOr<std::vector<ExchangeBenchRow>> RunExchangeBench(const ExchangeBenchOptions& o) {
  std::vector<ExchangeBenchRow> rows;
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  for (uint32_t W : o.world_sizes) {
    WorkloadOptions wo = o.workload;
    wo.world_size = W;
    ASSIGN_OR_RETURN(Workload w, GenerateWorkload(wo));
    DispatchOptions d = w.options;
    d.padded = o.padded;
    if (o.hidden_size > 0) d.hidden_size = o.hidden_size;
    d.balance_tolerance = o.balance_tolerance;
    say(absl::StrCat("W=", W, ": ", w.input.samples.size(), " samples (", w.vl_samples, " VL, ",
                     w.images, " images, ", w.audio_clips, " audio clips)"));
    ExchangeBenchRow base;
    base.ranks = W;
    base.nodes = d.cluster.nodes();
    base.samples = static_cast<uint32_t>(w.input.samples.size());
    base.vl_samples = w.vl_samples;
    base.images = w.images;
    base.audio_clips = w.audio_clips;
    base.glpk_status = "not run";

    std::vector<uint32_t> drawn(w.input.samples.size());
    for (size_t s = 0; s < drawn.size(); ++s) drawn[s] = w.input.samples[s].drawn_rank;
    ASSIGN_OR_RETURN(SplitEvaluation none, EvaluateSplit(w.input, d, drawn));
    ExchangeBenchRow row = base;
    row.mode = "none";
    FillPhases(none.phases, &row);
    row.overflow_sequences = none.overflow_sequences;
    rows.push_back(row);

    say(absl::StrCat("W=", W, ": pre-balancing"));
    row = base;
    row.mode = "pre";
    absl::StatusOr<std::vector<uint32_t>> split =
        o.pre_balance ? o.pre_balance(w.input, d)
                      : absl::StatusOr<std::vector<uint32_t>>(absl::FailedPreconditionError(
                            "no pre-balancer given (ExchangeBenchOptions::pre_balance)"));
    absl::StatusOr<SplitEvaluation> pre = split.ok()
                                              ? EvaluateSplit(w.input, d, *split)
                                              : absl::StatusOr<SplitEvaluation>(split.status());
    if (pre.ok()) {
      FillPhases(pre->phases, &row);
      row.overflow_sequences = pre->overflow_sequences;
    } else {
      row.error = std::string(pre.status().message());
    }
    rows.push_back(row);

    say(absl::StrCat("W=", W, ": post-balancing x", std::max(1u, o.plan_repeats)));
    row = base;
    row.mode = "post";
    std::vector<double> ms, cpu_ms;
    DispatchPlan plan;
    absl::Status failed;
    for (uint32_t k = 0; k < std::max(1u, o.plan_repeats) && failed.ok(); ++k) {
      // Timed: the Dispatch call alone (freeing the previous plan is not).
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = ThreadCpuMs();
      absl::StatusOr<DispatchPlan> next = Dispatch(w.input, d);
      cpu_ms.push_back(ThreadCpuMs() - c0);
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      if (next.ok()) {
        plan = *std::move(next);
      } else {
        failed = next.status();
      }
    }
    DispatchOptions oblivious = d;
    oblivious.node_aware = false;
    absl::StatusOr<DispatchPlan> obl =
        failed.ok() ? Dispatch(w.input, oblivious) : absl::StatusOr<DispatchPlan>(failed);
    if (!obl.ok()) {
      row.error = std::string(obl.status().message());
      rows.push_back(row);
      continue;
    }
    std::sort(ms.begin(), ms.end());
    std::sort(cpu_ms.begin(), cpu_ms.end());
    FillPhases(plan.stats.phases, &row);
    row.plan_ms_median = ms[ms.size() / 2];
    row.plan_cpu_ms_median = cpu_ms[cpu_ms.size() / 2];
    row.inter_node_bytes = plan.stats.inter_node_bytes + plan.stats.remote_load_bytes;
    row.inter_node_bytes_oblivious = obl->stats.inter_node_bytes + obl->stats.remote_load_bytes;
    row.exchange_bytes = plan.stats.inter_node_bytes + plan.stats.intra_node_bytes;
    row.llm_fallback = plan.stats.llm_fallback;
    if (o.transport != nullptr && *o.transport) {
      say(absl::StrCat("W=", W, ": exchange over the transport"));
      absl::StatusOr<TransportBenchResult> t = (*o.transport)(w.input, d, plan);
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
      RunGlpk(o, w, d, &row);
    }
    rows.push_back(row);
  }
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
      auto opt = [](const std::optional<double>& v, const char* f) {
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
        "\"llm_imbalance_vs_bound\": %.6g, \"overflow_sequences\": %u, \"inter_node_bytes\": %u, "
        "\"inter_node_bytes_oblivious\": %u, \"exchange_bytes\": %u, \"glpk_gap\": %s, "
        "\"glpk_optimum_bytes\": %s, \"glpk_fast_bytes\": %s, \"glpk_status\": %s, "
        "\"plan_ms_median\": %s, \"plan_cpu_ms_median\": %s, "
        "\"client_vs_bare_throughput\": %s, \"client_exchange_ms\": %s, "
        "\"bare_exchange_ms\": %s, \"exchange_bytes_per_rank\": %s, \"llm_fallback\": %s, "
        "\"error\": %s}%s\n",
        r.mode, r.ranks, r.nodes, r.samples, r.vl_samples, r.images, r.audio_clips,
        r.encoder_imbalance, r.encoder_vs_bound, opt(r.audio_imbalance), opt(r.audio_vs_bound),
        r.llm_imbalance, r.llm_vs_bound, r.overflow_sequences, r.inter_node_bytes,
        r.inter_node_bytes_oblivious, r.exchange_bytes, opt(r.glpk_gap), optu(r.glpk_optimum_bytes),
        optu(r.glpk_fast_bytes), quote(r.glpk_status), opt(r.plan_ms_median),
        opt(r.plan_cpu_ms_median), opt(r.client_vs_bare_throughput), opt(r.client_exchange_ms),
        opt(r.bare_exchange_ms), optu(r.exchange_bytes_per_rank), r.llm_fallback ? "true" : "false",
        r.error.empty() ? std::string("null") : quote(r.error), i + 1 < rows.size() ? "," : "");
  }
  out += "]\n";
  return out;
}

}  // namespace tutti::dispatch
