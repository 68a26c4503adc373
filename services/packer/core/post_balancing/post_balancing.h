// Batch post-balancing: the re-deal of one drawn step, on the planner's own
// StepPlanData. A pure function of its inputs (deterministic, no I/O).
//
// Dispatch reads from the step its drawn samples (shard, drawn rank,
// modality, LLM and text tokens), its images and audio clips (cost, output
// and input bytes) and its seq_len, and writes back every sample's LLM rank
// and sequence, every item's encoder rank, the remote loads and their
// sources, and the phase summaries (phases_from_dispatcher). The planner
// then lays out the exchange lists from the placement (core/exchange.h).
//
//   1. encoder phases   one per encoder (vision, audio): every image / clip on one rank
//   2. LLM phase        every sample a document in one packed sequence of one rank
//   3. locality         encoder items pulled onto their sample's LLM node
//   4. loads            remote inputs (shard not staged on the node) and their sources
//   5. statistics       per phase: max, mean, lower bound, bound, the drawn split
#ifndef TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_POST_BALANCING_H_
#define TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_POST_BALANCING_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/packer/core/plan_data.h"
#include "services/packer/core/post_balancing/dispatch_types.h"
#include "services/packer/core/post_balancing/llm_phase.h"

namespace tutti::dispatch {

using packer::PhaseSummary;
using packer::StepPlanData;

// INVALID_ARGUMENT for a malformed step or options (the message names the
// sample or option and the fix), FAILED_PRECONDITION for a shard staged on
// no node, RESOURCE_EXHAUSTED when the step's tokens exceed its sequences.
absl::Status ValidateStep(const StepPlanData& step, const ShardAvailability& staging,
                          const DispatchOptions& options);

// Places the drawn `step` (see above). options.slots.seq_len is taken from
// the step. On error the step's placement fields are unspecified.
absl::Status Dispatch(const ShardAvailability& staging, const DispatchOptions& options,
                      StepPlanData* step);

// A placement made elsewhere (the benchmark's peers re-deal each phase with
// their own balancer): per encoder, every item's rank in batch order, and
// every sample's LLM rank and sequence.
struct GivenPlacement {
  std::array<std::vector<uint32_t>, kNumEncoders> encoder_rank;
  LlmAssignment llm;
  std::string name;  // what step.rearrangement reports
};

// Writes `placement` to the step as Dispatch writes its own: remote loads
// and their sources, and the phase summaries in the options' cost variant
// (each phase's bound is the placement's own maximum). INVALID_ARGUMENT
// when the placement does not match the step, INTERNAL when it breaks a
// sequence's capacity or modality.
absl::Status ApplyPlacement(const ShardAvailability& staging, const DispatchOptions& options,
                            const GivenPlacement& placement, StepPlanData* step);

// The node-aware LLM rearrangement instance of a step exactly as Dispatch
// builds it: the encoder phases placed (node-aware when options.node_aware),
// and the LLM problem with the bytes each node would pull and the bound
// (1 + balance_tolerance) * lower bound (RearrangeLlm may raise it to the
// balanced makespan; an exact comparison must use the bound it returns).
// For comparing the fast rearrangement with the exact one (llm_ilp.h).
struct RearrangementInstance {
  LlmProblem problem;
  std::array<std::vector<uint32_t>, kNumEncoders> encoder_rank;  // per item, batch order
  std::array<double, kNumEncoders> encoder_bound{};
  std::array<double, kNumEncoders> encoder_lower_bound{};
  double llm_lower_bound = 0;
};
absl::StatusOr<RearrangementInstance> BuildRearrangement(const StepPlanData& step,
                                                         const ShardAvailability& staging,
                                                         const DispatchOptions& options);

// Statistics of one phase from per-rank costs and its lower bound (raised to
// the mean); imbalance_before and bound are left for the caller.
PhaseSummary MakePhaseSummary(const std::vector<double>& rank_cost, double lower_bound);

}  // namespace tutti::dispatch

#endif  // TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_POST_BALANCING_H_
