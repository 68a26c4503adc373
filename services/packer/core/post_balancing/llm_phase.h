// The LLM phase: every document (sample) goes into one sequence slot of one
// rank, text-only and VL documents into their own sequences, under seq_len,
// balancing the ranks' LLM cost; among balanced placements, the node-aware
// rearrangement picks one that moves few bytes between nodes.
//
// The rearrangement problem (shared by the fast algorithm here and the exact
// GLPK reference in llm_ilp.h, so their objectives are the same):
//   place every doc d on a rank r and a sequence of its modality, with
//     sequence tokens <= seq_len and every rank's LLM cost <= bound,
//   minimising  sum_d bytes(d, node(r_d)),
//     bytes(d, n) = affinity.base[d] - affinity.saved(d, n):
//   the encoder outputs (and remote token ids) of d that must cross nodes
//   when d's LLM rank is on node n.
#ifndef TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_LLM_PHASE_H_
#define TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_LLM_PHASE_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cost_model.h"
#include "services/packer/core/post_balancing/dispatch_types.h"
#include "services/packer/core/post_balancing/sequence_state.h"

namespace tutti::dispatch {

struct LlmDoc {
  uint32_t tokens = 0;
  bool vl = false;
  uint32_t image_tokens = 0;  // held to SlotLayout::img_cap per VL sequence
};

// Per doc, the bytes that cross nodes for each node its LLM rank may be on,
// stored sparsely: bytes(d, n) = base[d] - saved(d, n), saved = 0 for nodes
// not listed. Build with AddDoc in doc order.
class NodeAffinity {
 public:
  struct Entry {
    uint32_t node;
    uint64_t saved;
  };
  // Entries may repeat a node (they are summed) and come in any order;
  // *entries is reordered.
  void AddDoc(uint64_t base, std::vector<Entry>* entries);
  size_t docs() const { return base_.size(); }
  uint64_t base(uint32_t d) const { return base_.empty() ? 0 : base_[d]; }
  uint64_t Bytes(uint32_t d, uint32_t node) const;
  // The doc's listed nodes, by node index.
  const Entry* begin(uint32_t d) const { return entries_.data() + offset_[d]; }
  const Entry* end(uint32_t d) const { return entries_.data() + offset_[d + 1]; }
  bool empty() const { return base_.empty(); }
  // Hints that doc d's fields are read soon.
  void Prefetch(uint32_t d) const {
    if (base_.empty()) return;
    __builtin_prefetch(&base_[d]);
    __builtin_prefetch(&offset_[d]);
  }

 private:
  std::vector<uint64_t> base_;
  std::vector<uint32_t> offset_ = {0};
  std::vector<Entry> entries_;
};

struct LlmProblem {
  ClusterShape cluster;
  SlotLayout slots;
  CostModelOptions cost;
  bool padded = false;
  std::vector<LlmDoc> docs;
  NodeAffinity affinity;  // empty: no bytes anywhere (node-oblivious)
  double bound = std::numeric_limits<double>::infinity();  // max rank cost allowed
};

struct LlmAssignment {
  std::vector<uint32_t> rank;  // per doc
  std::vector<uint32_t> seq;   // per doc: sequence slot within its rank
};

// max(mean, largest single doc) for the cost variant. Padded: the mean is
// bounded through Jensen (a modality's tokens spread evenly over all its
// sequences) and a doc costs at least micro_batch_size * Llm(tokens).
double LlmLowerBound(const LlmProblem& problem);

// Node-oblivious balance: LPT on LLM cost into the ranks' sequences, then
// local search (moves and swaps off the most loaded rank). Ignores affinity
// and bound. RESOURCE_EXHAUSTED when the docs do not fit the sequences.
absl::StatusOr<LlmAssignment> BalanceLlm(const LlmProblem& problem, uint32_t rounds);

struct RearrangeResult {
  LlmAssignment assignment;
  double bound = 0;        // the bound kept (problem.bound, or raised; see RearrangeLlm)
  bool fell_back = false;  // problem.bound was out of reach and was raised
};

// The fast node-aware rearrangement. Greedy: docs in LPT order to the least
// loaded rank with room, as LPT balances; a doc with affinity goes instead
// to the least loaded rank of its cheapest node if that rank is not much
// more loaded (by what the remaining docs can still even out) and stays
// within the bound. Then local search: moves of a doc to a cheaper node, or
// into a rank there while ejecting another doc whose bytes grow less, within
// the bound; and balance moves that never add bytes.
// If the greedy misses problem.bound (padded: always assumed, its lower
// bound being loose), the bound is raised to
// max(problem.bound, (1 + tolerance) x the makespan of the node-oblivious
// `balanced` placement (computed with BalanceLlm when null)) and the greedy
// retried, then, failing that, the local search run from `balanced`.
// With a positive `target` (below the bound), the placement is then lowered
// toward it by balance moves that add bytes where they must: one that adds
// none first, else the fewest bytes per unit of peak taken off.
// Fails only as BalanceLlm does.
absl::StatusOr<RearrangeResult> RearrangeLlm(const LlmProblem& problem, uint32_t rounds,
                                             double tolerance,
                                             const LlmAssignment* balanced = nullptr,
                                             double target = 0);

// Recomputed from scratch (no incremental drift).
std::vector<double> LlmRankCosts(const LlmProblem& problem, const LlmAssignment& a);
uint64_t LlmInterNodeBytes(const LlmProblem& problem, const LlmAssignment& a);

// Every doc placed once, in a sequence of its modality, within seq_len; with
// check_bound, every rank's cost within problem.bound (relative slack 1e-9).
absl::Status CheckLlmAssignment(const LlmProblem& problem, const LlmAssignment& a,
                                bool check_bound);

}  // namespace tutti::dispatch

#endif  // TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_LLM_PHASE_H_
