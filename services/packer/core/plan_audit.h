// An independent audit of a planned step from the job alone (its config and
// index): what the step must be, recomputed without the planner's state and
// compared with what the plan says.
#ifndef TUTTI_SERVICES_PACKER_CORE_PLAN_AUDIT_H_
#define TUTTI_SERVICES_PACKER_CORE_PLAN_AUDIT_H_

#include "absl/status/status.h"
#include "services/packer/core/job.h"
#include "services/packer/core/plan_data.h"

namespace tutti::packer {

// OK when, for plan.step:
//  - the step's curriculum stage and seq_len are the config's;
//  - its samples are the ones the two streams draw (the config's seed and
//    samples per step over the index's streams) at the stream positions the
//    plan names, text then VL, each stream oldest first: the step's own
//    draw, less what it defers or skips, behind samples earlier steps
//    deferred (the queue it names, none older than
//    overflow.max_deferred_steps), each once; every position of its own
//    draw and of that queue is planned, deferred again or skipped (the
//    sequence of plans then has every position exactly once);
//  - every sample's LLM tokens, image tokens, ViT and LLM cost are what the
//    index and the stage give it; a truncated document holds seq_len
//    tokens with all its images; a split document's pieces add up to it;
//  - text samples sit in text sequences and VL samples in VL sequences of a
//    rank of the world, and no sequence holds more than the stage's seq_len
//    tokens or more than batch.img_cap_tokens image tokens;
//  - the LLM cost and ViT cost maxima, means and lower bounds
//    max(mean, largest item) the plan reports are the ones the placement
//    gives (unless a post-balancing dispatcher measured its own cost variant).
// INTERNAL naming the first difference otherwise. Then CheckPlannedStep
// (plan_check.h) checks the plan's lists against each other.
absl::Status AuditPlanAgainstJob(const Job& job, const StepPlanData& plan);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_PLAN_AUDIT_H_
