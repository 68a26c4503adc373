// The planning core: from (job config, index, seed, step) to the step's
// plan. Pure: no I/O, no clock, no network; the same inputs always give the
// same plan, so plans can be recomputed anywhere (a restarted packer, a
// benchmark, a test).
//
//   1. global batch: text_samples_per_step text-only samples and
//      vl_samples_per_step VL samples from the two stream permutations
//      (sampler.h), behind the samples earlier steps deferred; documents
//      longer than seq_len shaped by the overflow policy and the longest
//      certainly packable prefix of each stream admitted, the rest deferred
//      (overflow.h); dealt round-robin to ranks as the "drawn" split;
//   2. curriculum: the stage at `step` gives max_pixels and seq_len; every
//      image is sized by smart resize and costed (costs.h);
//   3. the dispatcher (dispatch.h) places samples into each rank's text and
//      VL sequences and encoder items onto encoder ranks: colocated
//      (pre-balancing, through the packing strategy, packing.h) or batch
//      post-balancing (services/packer/dispatch/);
//   4. chunked ViT forward (chunking.h), the forward and load exchange lists
//      (exchange.h), per-rank costs and phase statistics.
//
// The deferral queue entering step k is a function of the steps before it.
// It is recovered by replaying admission (costs and the certificate only, no
// packing) over the window [k - H, k) from an empty queue, H =
// overflow.max_deferred_steps. Admission is monotone in the queue a step
// starts with, so the replay's queue is contained in the true one at every
// step, and equals it from the first step at which the true queue is empty;
// a job whose queue stays non-empty for H consecutive steps stops with
// RESOURCE_EXHAUSTED, so in every job that reaches step k the true queue was
// empty somewhere in the window and the replay is exact. Transitions are
// cached, so planning steps in order replays nothing.
#ifndef TUTTI_SERVICES_PACKER_CORE_PLANNER_H_
#define TUTTI_SERVICES_PACKER_CORE_PLANNER_H_

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "absl/status/status.h"
#include "services/packer/core/job.h"
#include "services/packer/core/plan_data.h"

namespace tutti::packer {

// Which node's stager holds which shard, as the packer learns it (e.g. from
// stager reports). Plans depend on it: with the same answer for a step, the
// same plan. Implementations must be thread-safe (planner threads call At
// concurrently). Without one, every shard counts as staged on every node.
class ShardStaging {
 public:
  virtual ~ShardStaging() = default;
  // The availability for `step`: ShardAvailability::None(shards, nodes)
  // with the staged (shard, node) pairs set, over the index's shards and the
  // job's nodes; or the default (everything everywhere).
  virtual dispatch::ShardAvailability At(uint64_t step) const = 0;
};

class Planner {
 public:
  // `staging` (may be null: everything staged everywhere) must outlive the
  // planner.
  explicit Planner(std::shared_ptr<const Job> job, const ShardStaging* staging = nullptr)
      : job_(std::move(job)), staging_(staging) {}

  // Plans `step` into *out, reusing its buffers. Thread-safe (const).
  // OUT_OF_RANGE for a step beyond the dataset's end; RESOURCE_EXHAUSTED
  // when the deferral queue entering the step broke overflow.max_deferred_*
  // (the data cannot keep up with the constraints), naming the step and the
  // cause. A step the strategy cannot pack is packed by the first-fit
  // fallback (overflow.h), which packs every admitted set.
  absl::Status Plan(uint64_t step, StepPlanData* out) const;

  // Only the draw (stages 1-2 above): the step's admitted samples, images
  // and audio clips with their costs and drawn ranks, before any dispatcher
  // places them. For tests and benchmarks of the dispatchers.
  absl::Status Draw(uint64_t step, StepPlanData* out) const;

  // The deferral queue entering `step` (see above), or RESOURCE_EXHAUSTED.
  absl::StatusOr<DeferralQueue> QueueEntering(uint64_t step) const;

  const Job& job() const { return *job_; }
  const std::shared_ptr<const Job>& job_ptr() const { return job_; }

 private:
  // Stage 1's admission over the drawn candidates in *out (samples in
  // candidate order): shapes long documents, admits each stream's longest
  // certainly packable prefix and sets out->deferred_out and the counts.
  absl::Status Admit(StepPlanData* out) const;
  // The queue after `step` for the queue `in` entering it: admission over
  // the candidates' sizes only (no packing). Cached.
  absl::StatusOr<DeferralQueue> Transition(uint64_t step, const DeferralQueue& in) const;
  void Remember(uint64_t step, const DeferralQueue& in, const DeferralQueue& out) const;

  std::shared_ptr<const Job> job_;
  const ShardStaging* staging_;
  // Transitions computed so far, by step (a bounded window of steps).
  mutable absl::Mutex mu_;
  mutable std::map<uint64_t, std::vector<std::pair<DeferralQueue, DeferralQueue>>> transitions_
      ABSL_GUARDED_BY(mu_);
};

// Stage 4 for a placed step: the docs and encoder lists, chunks and the
// forward and load exchange lists (what Plan does after the dispatcher).
void LayOutStep(uint32_t max_patches_per_chunk, StepPlanData* step);
// Per-rank totals and, unless the dispatcher measured them, the phase
// summaries (`post`: encoder items are placed apart from their samples).
void SummarizeStep(bool post, StepPlanData* step);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_PLANNER_H_
