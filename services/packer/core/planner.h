// The planning core: from (job config, index, seed, step) to the step's
// plan. Pure: no I/O, no clock, no network; the same inputs always give the
// same plan, so plans can be recomputed anywhere (a restarted packer, a
// benchmark, a test).
//
//   1. global batch: text_samples_per_step text-only samples and
//      vl_samples_per_step VL samples from the two stream permutations
//      (sampler.h), dealt round-robin to ranks as the "drawn" split;
//   2. curriculum: the stage at `step` gives max_pixels and seq_len; every
//      image is sized by smart resize and costed (costs.h);
//   3. the dispatcher (dispatch.h) places samples into each rank's text and
//      VL sequences and encoder items onto encoder ranks: colocated
//      (pre-balancing, through the packing strategy, packing.h) or batch
//      post-balancing (services/packer/dispatch/);
//   4. chunked ViT forward (chunking.h), the forward and load exchange lists
//      (exchange.h), per-rank costs and phase statistics.
#ifndef TUTTI_SERVICES_PACKER_CORE_PLANNER_H_
#define TUTTI_SERVICES_PACKER_CORE_PLANNER_H_

#include <memory>

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
  // OUT_OF_RANGE for a step beyond the dataset's end; FAILED_PRECONDITION
  // when the step's samples do not fit its sequences.
  absl::Status Plan(uint64_t step, StepPlanData* out) const;

  // Only the draw (stages 1-2 above): the step's samples, images and audio
  // clips with their costs and drawn ranks, before any dispatcher places
  // them. For tests and benchmarks of the dispatchers.
  absl::Status Draw(uint64_t step, StepPlanData* out) const;

  const Job& job() const { return *job_; }
  const std::shared_ptr<const Job>& job_ptr() const { return job_; }

 private:
  std::shared_ptr<const Job> job_;
  const ShardStaging* staging_;
};

// Stage 4 for a placed step: the docs and encoder lists, chunks and the
// forward and load exchange lists (what Plan does after the dispatcher).
void LayOutStep(uint32_t max_patches_per_chunk, StepPlanData* step);
// Per-rank totals and, unless the dispatcher measured them, the phase
// summaries (`post`: encoder items are placed apart from their samples).
void SummarizeStep(bool post, StepPlanData* step);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_PLANNER_H_
