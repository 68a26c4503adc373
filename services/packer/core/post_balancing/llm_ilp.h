// Exact reference for the node-aware LLM rearrangement (llm_phase.h), by
// integer programming with GLPK, for small instances (tests, benchmarks).
//
//   x[d][r][q] in {0,1}: doc d in sequence q (of d's modality) of rank r
//   sum_{r,q} x[d][r][q] = 1                        every doc once
//   sum_d tokens_d x[d][r][q] <= seq_len            every sequence
//   unpadded: sum_{d,q} cost_d x[d][r][q] <= bound  every rank
//   padded:   z[r][m] >= tokens of each sequence of micro-batch m,
//             y[r][m] >= size_m * Llm(z) (tangent cuts of the convex cost,
//             refined at the solution until it holds exactly),
//             sum_m y[r][m] <= bound
//   minimise  sum bytes(d, node(r)) x[d][r][q]
// The objective and constraints are the fast algorithm's, so the gap between
// the two is meaningful.
#ifndef TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_LLM_ILP_H_
#define TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_LLM_ILP_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "services/packer/core/post_balancing/llm_phase.h"

namespace tutti::dispatch {

struct IlpOptions {
  // Wall-clock budget for all GLPK calls together. Default 10 s.
  double time_limit_s = 10.0;
  // A feasible placement handed to GLPK as its first incumbent (speeds up
  // pruning; the optimum does not depend on it). Default none.
  const LlmAssignment* start = nullptr;
  // Padded: tangent points of the initial cut set, spread over [0, seq_len].
  // Default 9.
  uint32_t tangents = 9;
  // Padded: rounds of cut refinement before giving up. Default 40.
  uint32_t max_cut_rounds = 40;
  // Refuse instances with more binary variables than this. Default 200000.
  uint64_t max_binaries = 200000;
  // Branch-and-bound subproblems GLPK may select (over all cut rounds)
  // before it gives up with kNoResult. Unlike the time limit this budget
  // does not depend on the machine, so an instance either always or never
  // finishes within it. 0 (default): no budget.
  uint64_t max_nodes = 0;
};

enum class IlpOutcome {
  kOptimal,     // proven optimal; assignment and bytes are set
  kInfeasible,  // no placement meets the constraints
  kNoResult,    // GLPK did not finish within the time or node budget
};

struct IlpResult {
  IlpOutcome outcome = IlpOutcome::kNoResult;
  LlmAssignment assignment;
  uint64_t bytes = 0;  // inter-node bytes of the optimum
  double seconds = 0;
  uint32_t cut_rounds = 0;
  std::string detail;  // why there is no result
};

// INVALID_ARGUMENT for an instance above max_binaries; otherwise a result,
// which may be kNoResult.
absl::StatusOr<IlpResult> SolveLlmIlp(const LlmProblem& problem, const IlpOptions& options);

}  // namespace tutti::dispatch

#endif  // TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_LLM_ILP_H_
