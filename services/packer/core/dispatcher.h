// Dispatchers decide, for one drawn step, which rank and sequence every
// sample occupies in the LLM phase, which rank encodes every image and audio
// clip, and where inputs are loaded. The planner (planner.h) draws the step
// into a StepPlanData, a dispatcher places it, and the planner lays out the
// exchanges, chunks and statistics from the placement.
//
//   colocated  pre-balancing: the packing strategy (packing.h) places whole
//              samples and every image and clip is encoded on its sample's
//              LLM rank (the strategy then balances ViT cost too); the
//              forward exchange is self-transfers only.
//   post       batch post-balancing (OrchMLLM; the algorithms are the
//              tutti_dispatch library in services/packer/dispatch/): given
//              each rank's drawn samples, one encoder phase per encoder
//              (vision, audio) balanced on that encoder's cost, the LLM phase
//              balanced on LLM cost (padded or unpadded) in the ranks'
//              seq_len sequences, node-aware (among balanced placements the
//              one with the fewest inter-node bytes: the fast algorithm, or
//              GLPK for small jobs); the encoder rank loads what it encodes,
//              and an input whose shard its node does not stage comes
//              through the load exchange. Encoder outputs then travel from
//              encoder rank to LLM rank in one exchange (its inverse carries
//              the gradients back). The packing strategy is not used.
#ifndef TUTTI_SERVICES_PACKER_CORE_DISPATCHER_H_
#define TUTTI_SERVICES_PACKER_CORE_DISPATCHER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/cost_model.h"
#include "services/packer/core/packing.h"
#include "services/packer/core/plan_data.h"
#include "services/packer/core/post_balancing/dispatch_types.h"

namespace tutti::packer {

// post_balancing.balance_tolerance: its default and the largest a job may
// set (job.proto).
inline constexpr double kDefaultBalanceTolerance = 0.0001;
inline constexpr double kMaxBalanceTolerance = 0.1;

// What a dispatcher needs besides the drawn step.
struct DispatchStep {
  const CostModel* model = nullptr;  // the step's curriculum stage
  // Which node's stager stages which shard (index shard numbers); the
  // default, every shard on every node, is what tutti-packerd assumes until
  // stagers report what they hold (see ShardStaging in planner.h).
  const dispatch::ShardAvailability* staging = nullptr;
};

class Dispatcher {
 public:
  virtual ~Dispatcher() = default;
  // "colocated" or "post-balancing".
  virtual const std::string& name() const = 0;
  // `plan` holds the drawn step: samples (drawn_rank, shard, costs), images,
  // audio clips, seq_len, and the strategy inputs text_items / vl_items.
  // Sets every sample's rank and seq, every item's enc_rank and the remote
  // load fields; a dispatcher that measures the phases itself sets
  // phases_from_dispatcher and the phase summaries. Deterministic.
  // FAILED_PRECONDITION when the samples do not fit the sequences.
  virtual absl::Status Dispatch(const DispatchStep& step, StepPlanData* plan) const = 0;
};

// The job-wide settings of a dispatcher (from the job config).
struct DispatcherOptions {
  uint32_t world_size = 1;
  uint32_t ranks_per_node = 1;
  // Per rank: text micro-batches of text_micro_batch sequences, then VL
  // micro-batches of vl_micro_batch sequences.
  uint32_t text_micro_batches = 1;
  uint32_t text_micro_batch = 1;
  uint32_t vl_micro_batches = 1;
  uint32_t vl_micro_batch = 1;
  uint32_t img_cap = 0;  // colocated: image tokens per sequence (0 = none)
  // post: LLM cost variant, rearrangement, embedding bytes per token.
  bool padded = false;
  dispatch::Rearrangement rearrangement = dispatch::Rearrangement::kFast;
  uint32_t hidden_size = 4096;
  uint32_t embedding_dtype_bytes = 2;
  // post: the node-oblivious baseline (false) that benchmarks measure the
  // node-aware plan against (default true; not job configuration), and the
  // balance tolerance (post_balancing.balance_tolerance; dispatch_types.h).
  bool node_aware = true;
  double balance_tolerance = kDefaultBalanceTolerance;
  // post: documents' token ids weigh in the LLM placement (false with shard
  // homes: DispatchOptions::text_affinity). Default true.
  bool text_affinity = true;
};

// The post-balancing library's options for these settings (cost model and
// seq_len are the step's).
dispatch::DispatchOptions PostBalancingOptions(const DispatcherOptions& options);

// `strategy` must outlive the dispatcher.
std::unique_ptr<Dispatcher> MakeColocatedDispatcher(const PackingStrategy* strategy,
                                                    const DispatcherOptions& options);
std::unique_ptr<Dispatcher> MakePostBalancingDispatcher(const DispatcherOptions& options);
// Post-balancing by a peer strategy (lpt, kk, multipack, sequential;
// `peer` must outlive the dispatcher): each phase re-dealt by the peer's own
// balancer, node-oblivious (the LLM phase on LLM cost into the sequences,
// each encoder phase a partition of its items on their cost). The baseline
// `tutti bench packer --post-balancing` compares tutti's plans with.
std::unique_ptr<Dispatcher> MakePeerRedealDispatcher(const PackingStrategy* peer,
                                                     const DispatcherOptions& options);

// Binary variables of the exact LLM rearrangement for a step of
// `text_samples` + `vl_samples` samples: each sample times every rank's
// sequences of its modality. The job refuses "ilp" above kIlpMaxBinaries.
uint64_t IlpBinaries(const DispatcherOptions& options, uint64_t text_samples, uint64_t vl_samples);
inline constexpr uint64_t kIlpMaxBinaries = 20000;

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_DISPATCHER_H_
