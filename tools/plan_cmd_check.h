// `tutti plan --check`: plans a range of steps and checks every plan against
// what the job alone (its config and index) says it must be, with the
// packer's own independent checks: AuditPlanAgainstJob (the draw, exactly
// once, every sample's tokens and costs, seq_len and img_cap per sequence,
// the phase figures the plan reports) and CheckPlannedStep (placement,
// encoder lists, exchange lists, totals), plus the phase figures of the
// StepPlan message the packer serves.
#ifndef TUTTI_TOOLS_PLAN_CMD_CHECK_H_
#define TUTTI_TOOLS_PLAN_CMD_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/packer/core/job.h"
#include "services/packer/core/plan_data.h"

namespace tutti::tools {

// OK when the planned step `d` of `job` passes AuditPlanAgainstJob and
// CheckPlannedStep (with the job's img_cap), and the StepPlan built from it
// reports the same ViT and LLM max, mean, imbalance and lower bound;
// INTERNAL naming the first violation otherwise.
absl::Status CheckPlan(const packer::Job& job, const packer::StepPlanData& d);

// One checked step: its figures as the plan reports them (verified by
// CheckPlan when `status` is OK).
struct StepCheck {
  uint64_t step = 0;
  uint32_t stage = 0;
  uint32_t samples = 0;
  bool planned = false;  // false: the planner refused the step (`status`)
  double vit_imbalance = 1, vit_over_bound = 1, llm_imbalance = 1, llm_over_bound = 1;
  absl::Status status;
};

struct PlanCheckSummary {
  std::vector<StepCheck> steps;
  uint64_t violations = 0;  // planned steps that failed a check
  uint64_t unplanned = 0;   // steps the planner refused
  bool ok() const { return violations == 0 && unplanned == 0; }
};

// Plans steps [first, first + count) of `job` (stopping at the job's end)
// and checks each with CheckPlan.
PlanCheckSummary CheckSteps(std::shared_ptr<const packer::Job> job, uint64_t first, uint64_t count);

// The table (`per_step`: one line per step, else only the steps that fail)
// and a summary line.
std::string FormatPlanCheck(const packer::Job& job, const PlanCheckSummary& summary, bool per_step);

}  // namespace tutti::tools

#endif  // TUTTI_TOOLS_PLAN_CMD_CHECK_H_
