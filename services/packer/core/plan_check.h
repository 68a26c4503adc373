// An independent check of a planned step (StepPlanData after the planner
// laid it out), from the plan's own lists: what the planner promises, each
// property recomputed rather than trusted. Cheap enough to run on every plan
// in tests and benchmarks.
#ifndef TUTTI_SERVICES_PACKER_CORE_PLAN_CHECK_H_
#define TUTTI_SERVICES_PACKER_CORE_PLAN_CHECK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "services/packer/core/plan_data.h"
#include "services/packer/core/post_balancing/dispatch_types.h"

namespace tutti::packer {

struct PlanCheckOptions {
  // Image tokens per sequence; 0 = no cap.
  uint32_t img_cap = 0;
  // Which node stages which shard (remote loads are checked against it).
  const dispatch::ShardAvailability* staging = nullptr;  // nullptr: everywhere
};

// OK when:
//  - no index sample appears twice in the step (a split document's pieces,
//    in order and complete, are one sample, each piece in its own sequence);
//  - every sample is a document of exactly one sequence of its modality on
//    its rank (the docs lists agree with rank and seq), and no sequence
//    holds more than seq_len LLM tokens or more than img_cap image tokens;
//  - every encoder item is in exactly one rank's encoder list, its
//    enc_rank's; remote_load is set exactly when that rank's node does not
//    stage the shard, with a load source on a node that does;
//  - the forward exchange sends every encoder output exactly once from its
//    encoder rank to its sample's LLM rank, the receiver's list matches the
//    sender's item for item, and the inter/intra-node byte totals add up;
//  - the load exchange carries exactly the remote inputs, likewise;
//  - the per-rank totals and phase maxima match the placement.
// INTERNAL naming the first violation otherwise.
absl::Status CheckPlannedStep(const StepPlanData& plan, const PlanCheckOptions& options = {});

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_PLAN_CHECK_H_
