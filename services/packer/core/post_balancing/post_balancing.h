// Batch post-balancing: the whole re-deal of one step, from the drawn
// samples to per-rank encoder items, packed LLM sequences and the composed
// exchange lists. A pure function of its inputs (deterministic, no I/O).
#ifndef TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_POST_BALANCING_H_
#define TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_POST_BALANCING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/packer/core/post_balancing/dispatch_types.h"
#include "services/packer/core/post_balancing/llm_phase.h"

namespace tutti::dispatch {

// INVALID_ARGUMENT for a malformed input (the message names the sample or
// option and the fix), FAILED_PRECONDITION for a shard staged on no node,
// RESOURCE_EXHAUSTED when the step's tokens exceed its sequences.
absl::Status ValidateDispatchInput(const DispatchInput& input, const DispatchOptions& options);

// Computes the encoder phases (vision, audio), the LLM phase, the remote
// loads and the forward and load exchanges. The backward exchange is
// InverseExchange(plan.cluster, plan.forward) (exchange.h).
absl::StatusOr<DispatchPlan> Dispatch(const DispatchInput& input, const DispatchOptions& options);

// The node-aware LLM rearrangement instance of a step exactly as Dispatch
// builds it: the encoder phases placed (node-aware when options.node_aware),
// and the LLM problem with the bytes each node would pull and the bound
// (1 + balance_tolerance) * lower bound (RearrangeLlm may raise it to the
// balanced makespan; an exact comparison must use the bound it returns).
// For comparing the fast rearrangement with the exact one (llm_ilp.h).
struct RearrangementInstance {
  LlmProblem problem;
  std::array<std::vector<uint32_t>, kNumEncoders> encoder_rank;  // per flattened item
  std::array<double, kNumEncoders> encoder_bound{};
  std::array<double, kNumEncoders> encoder_lower_bound{};
  double llm_lower_bound = 0;
};
absl::StatusOr<RearrangementInstance> BuildRearrangement(const DispatchInput& input,
                                                         const DispatchOptions& options);

// A fixed split without post-balancing: every sample is encoded and packed on
// split[sample]. Sequences are filled largest document first; documents that
// find no room open extra one-sequence micro-batches (counted).
struct SplitEvaluation {
  std::vector<PhaseStats> phases;  // "vit", "audio" (when present), "llm"; imbalance_before unset
  uint32_t overflow_sequences = 0;
};
absl::StatusOr<SplitEvaluation> EvaluateSplit(const DispatchInput& input,
                                              const DispatchOptions& options,
                                              const std::vector<uint32_t>& split);

// Statistics of one phase from per-rank costs and its lower bound.
PhaseStats MakePhaseStats(const char* phase, const std::vector<double>& rank_cost,
                          double lower_bound);

}  // namespace tutti::dispatch

#endif  // TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_POST_BALANCING_H_
