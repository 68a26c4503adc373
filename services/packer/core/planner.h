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
// The deferral queue entering step k is a function of the steps before it:
// each stream's frontier (overflow.h; the queue is the positions from the
// frontier to the step's first). A restarted planner recovers it by
// replaying admission (costs and first-fit only, no strategy) from two
// bounds on the frontier some steps back: nothing waiting, and the most that
// a job still running could have waiting (overflow.max_deferred_samples, none
// drawn more than overflow.max_deferred_steps steps before). Admission is
// monotone in the frontier, so the truth stays between the two replays, and
// from the step where they meet they are the truth; without a meeting the
// replay starts twice as far back, down to step 0. Frontiers and
// transitions are remembered, so planning steps in order replays nothing.
#ifndef TUTTI_SERVICES_PACKER_CORE_PLANNER_H_
#define TUTTI_SERVICES_PACKER_CORE_PLANNER_H_

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/packer/core/cost_schedule.h"
#include "services/packer/core/job.h"
#include "services/packer/core/overflow.h"
#include "services/packer/core/plan_data.h"

namespace tutti::packer {

struct StreamCandidates;  // planner_overflow.cc
struct DrawnAdmission;    // planner_overflow.cc

// Each stream's frontier: its positions below it are planned or skipped.
struct Frontier {
  uint64_t text = 0, vl = 0;
  bool operator==(const Frontier& o) const { return text == o.text && vl == o.vl; }
};
// One stream's admission at a step from frontier f: candidates [f, frontier)
// are admitted, packed by the fallback after positions [lead, f).
struct StreamAdmission {
  uint64_t frontier = 0, lead = 0;
};

// Which node's stager holds which shard, as the packer learns it (e.g. from
// stager reports). Plans depend on it: with the same answer for a step, the
// same plan. Implementations must be thread-safe (planner threads call At
// concurrently). Without one, the job's home nodes (Job::homes, locality)
// or, without locality, every shard on every node.
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
  // `staging` (may be null: the job's home nodes with locality, else
  // everything staged everywhere) and `costs` (may
  // be null: the job config's constants at every step; else the fits in
  // force by step, cost_schedule.h) must outlive the planner.
  explicit Planner(std::shared_ptr<const Job> job, const ShardStaging* staging = nullptr,
                   const CostSchedule* costs = nullptr)
      : job_(std::move(job)), staging_(staging), costs_(costs) {}

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
  // Its per-candidate part runs during the draw, while each candidate's
  // records are at hand: BeginAdmission once the arrays are sized, then
  // AddAdmissionCandidate with what BeginAdmission returned for every
  // candidate k in order, once its images and audio clips are drawn; then
  // Admit (all in one thread).
  DrawnAdmission& BeginAdmission(const StepPlanData& out) const;
  void AddAdmissionCandidate(DrawnAdmission& a, uint32_t k, const StepPlanData& out) const;
  absl::Status Admit(StepPlanData* out) const;
  // The frontier entering `step` (see above), or RESOURCE_EXHAUSTED.
  absl::StatusOr<Frontier> FrontierEntering(uint64_t step) const;
  // The frontier after `step` for `in` entering it. Cached.
  absl::StatusOr<Frontier> Advance(uint64_t step, const Frontier& in) const;
  // One stream's admission at `step` from frontier f (overflow.h). `drawn`:
  // the candidates of positions [f, step's end) if already costed, else
  // null; `lead` (may be null) receives the items of [lead, f).
  absl::StatusOr<StreamAdmission> AdmitStream(uint64_t step, bool vl, uint64_t f,
                                              const StreamCandidates* drawn,
                                              std::vector<PackItem>* lead) const;
  // Appends the candidates of stream positions [lo, hi), costed at `step`.
  absl::Status CostPositions(uint64_t step, bool vl, uint64_t lo, uint64_t hi,
                             StreamCandidates* c) const;
  PackCertificate Certificate(uint64_t step, bool vl) const;
  // RESOURCE_EXHAUSTED when the queue entering `step` breaks
  // overflow.max_deferred_*.
  absl::Status CheckEntering(uint64_t step, const Frontier& f) const;
  void RememberFrontier(uint64_t step, const Frontier& f) const;

  struct TransitionEntry {
    bool vl = false;
    uint64_t from = 0;
    StreamAdmission to;
  };
  static constexpr size_t kRememberedSteps = 4096;

  std::shared_ptr<const Job> job_;
  const ShardStaging* staging_;
  const CostSchedule* costs_;
  // Transitions and true frontiers computed so far, by step (a bounded
  // window of steps).
  mutable absl::Mutex mu_;
  mutable std::map<uint64_t, std::vector<TransitionEntry>> transitions_ ABSL_GUARDED_BY(mu_);
  mutable std::map<uint64_t, Frontier> known_ ABSL_GUARDED_BY(mu_);
};

// Stage 4 for a placed step: the docs and encoder lists, chunks and the
// forward and load exchange lists (what Plan does after the dispatcher).
void LayOutStep(uint32_t max_patches_per_chunk, StepPlanData* step);
// Per-rank totals and, unless the dispatcher measured them, the phase
// summaries (`post`: encoder items are placed apart from their samples).
void SummarizeStep(bool post, StepPlanData* step);
// Fills step->step_shards from its samples (shards below num_shards); Plan
// does it when the job has locality.
void ListStepShards(uint32_t num_shards, StepPlanData* step);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_PLANNER_H_
