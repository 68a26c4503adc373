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
//   3. the dispatcher (dispatch.h) and packing strategy (packing.h) place
//      samples into each rank's text and VL sequences and images onto
//      encoder ranks;
//   4. chunked ViT forward (chunking.h), exchange lists (exchange.h) and
//      per-rank costs and phase statistics.
#ifndef TUTTI_SERVICES_PACKER_PLANNER_H_
#define TUTTI_SERVICES_PACKER_PLANNER_H_

#include <memory>

#include "absl/status/status.h"
#include "services/packer/job.h"
#include "services/packer/plan_data.h"

namespace tutti::packer {

class Planner {
 public:
  explicit Planner(std::shared_ptr<const Job> job) : job_(std::move(job)) {}

  // Plans `step` into *out, reusing its buffers. Thread-safe (const).
  // OUT_OF_RANGE for a step beyond the dataset's end; FAILED_PRECONDITION
  // when the step's samples do not fit its sequences.
  absl::Status Plan(uint64_t step, StepPlanData* out) const;

  const Job& job() const { return *job_; }
  const std::shared_ptr<const Job>& job_ptr() const { return job_; }

 private:
  absl::Status Draw(uint64_t step, StepPlanData* out) const;
  void Summarize(StepPlanData* out) const;

  std::shared_ptr<const Job> job_;
};

// Bytes per element of an embedding dtype (2 for BF16/FP16, 4 for FP32...).
uint32_t DTypeBytes(int dtype);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_PLANNER_H_
