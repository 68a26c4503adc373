#include "tools/plan_cmd_check.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/packer/core/plan_audit.h"
#include "services/packer/core/plan_check.h"
#include "services/packer/core/planner.h"
#include "services/packer/plan_proto.h"

namespace tutti::tools {
namespace {

bool Close(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max({1.0, a, b}); }

double OverBound(const packer::PhaseSummary& s) {
  return s.lower_bound > 0 ? s.max / s.lower_bound : 1.0;
}

}  // namespace

absl::Status CheckPlan(const packer::Job& job, const packer::StepPlanData& d) {
  if (absl::Status s = packer::AuditPlanAgainstJob(job, d); !s.ok()) return s;
  packer::PlanCheckOptions options;
  options.img_cap = job.config().batch().img_cap_tokens();
  if (absl::Status s = packer::CheckPlannedStep(d, options); !s.ok()) return s;
  // What the packer serves: the StepPlan message's phase figures.
  v1::StepPlan plan;
  if (absl::Status s = packer::BuildStepPlan(job, d, {}, &plan); !s.ok()) {
    return absl::InternalError(
        absl::StrCat("step ", d.step, ": building the StepPlan: ", s.message()));
  }
  // The exchange as the ranks read it: every pair one contiguous run at both ends.
  if (absl::Status s = packer::CheckExchangeLayout(plan); !s.ok()) return s;
  int seen = 0;
  for (const v1::PhaseStats& ph : plan.stats().phases()) {
    const packer::PhaseSummary* want = ph.phase() == "vit"   ? &d.vit
                                       : ph.phase() == "llm" ? &d.llm
                                                             : nullptr;
    if (want == nullptr) continue;
    ++seen;
    if (!Close(ph.max(), want->max) || !Close(ph.mean(), want->mean) ||
        !Close(ph.imbalance(), want->imbalance) || !Close(ph.lower_bound(), want->lower_bound)) {
      return absl::InternalError(
          absl::StrCat("step ", d.step, ": the StepPlan reports ", ph.phase(), " max ", ph.max(),
                       " mean ", ph.mean(), " imbalance ", ph.imbalance(), " bound ",
                       ph.lower_bound(), ", the audited plan ", want->max, " / ", want->mean, " / ",
                       want->imbalance, " / ", want->lower_bound));
    }
  }
  if (seen != 2) {
    return absl::InternalError(absl::StrCat("step ", d.step, ": the StepPlan reports ", seen,
                                            " of the vit and llm phases"));
  }
  return absl::OkStatus();
}

PlanCheckSummary CheckSteps(std::shared_ptr<const packer::Job> job, uint64_t first,
                            uint64_t count) {
  PlanCheckSummary out;
  packer::Planner planner(job);
  packer::StepPlanData d;
  const uint64_t end = job->total_steps();  // 0: no end
  for (uint64_t s = first; s < first + count && (end == 0 || s < end); ++s) {
    StepCheck& c = out.steps.emplace_back();
    c.step = s;
    c.stage = job->StageIndex(s);
    c.status = planner.Plan(s, &d);
    if (!c.status.ok()) {
      ++out.unplanned;
      continue;
    }
    c.planned = true;
    c.samples = static_cast<uint32_t>(d.samples.size());
    c.vit_imbalance = d.vit.imbalance;
    c.vit_over_bound = OverBound(d.vit);
    c.llm_imbalance = d.llm.imbalance;
    c.llm_over_bound = OverBound(d.llm);
    c.status = CheckPlan(*job, d);
    if (!c.status.ok()) ++out.violations;
  }
  return out;
}

std::string FormatPlanCheck(const packer::Job& job, const PlanCheckSummary& summary,
                            bool per_step) {
  std::string out = absl::StrFormat("%8s %5s %8s %9s %9s %9s %9s  %s\n", "step", "stage", "samples",
                                    "vit", "vit/lb", "llm", "llm/lb", "check");
  double vit_sum = 0, llm_sum = 0, vit_worst = 0, llm_worst = 0;
  uint64_t planned = 0;
  for (const StepCheck& c : summary.steps) {
    if (c.planned) {
      ++planned;
      vit_sum += c.vit_over_bound;
      llm_sum += c.llm_over_bound;
      vit_worst = std::max(vit_worst, c.vit_over_bound);
      llm_worst = std::max(llm_worst, c.llm_over_bound);
    }
    if (!per_step && c.status.ok()) continue;
    const std::string verdict =
        c.status.ok()
            ? "ok"
            : absl::StrCat(c.planned ? "VIOLATION: " : "NOT PLANNED: ", c.status.message());
    if (c.planned) {
      absl::StrAppendFormat(&out, "%8u %5u %8u %9.4f %9.4f %9.4f %9.4f  %s\n", c.step, c.stage,
                            c.samples, c.vit_imbalance, c.vit_over_bound, c.llm_imbalance,
                            c.llm_over_bound, verdict);
    } else {
      absl::StrAppendFormat(&out, "%8u %5u %8s %9s %9s %9s %9s  %s\n", c.step, c.stage, "-", "-",
                            "-", "-", "-", verdict);
    }
  }
  const v1::JobConfig& cfg = job.config();
  absl::StrAppendFormat(
      &out,
      "checked %u steps at W=%u (%s, post-balancing %s): %u violations, %u not planned; "
      "vit max/lb mean %.4f worst %.4f, llm max/lb mean %.4f worst %.4f\n",
      summary.steps.size(), cfg.world_size(), job.plan_strategy(),
      cfg.post_balancing().enabled() ? "on" : "off", summary.violations, summary.unplanned,
      planned ? vit_sum / planned : 0.0, vit_worst, planned ? llm_sum / planned : 0.0, llm_worst);
  return out;
}

}  // namespace tutti::tools
