// Plan intake: which step plans the stager wants from the packer next, and
// what it makes of each plan that arrives.
//
// Plans are held for the window and `stage_ahead` steps beyond it, so the
// range wanted is [next, base + window + stage_ahead) (capped at the job's
// end), where base is the window's first step; room appears as clients
// release batches. A window that moves elsewhere (a job resumed at another
// step) restarts intake there in a new generation: plans of an older
// generation are refused, and the caller reopens its stream. A step the
// packer cannot serve is recorded, with the packer's reason, for it and every
// later step.
//
// Not thread-safe: StagerCore keeps it under its lock.
#ifndef TUTTI_SERVICES_STAGER_PLAN_INTAKE_H_
#define TUTTI_SERVICES_STAGER_PLAN_INTAKE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "tutti/v1/packer.pb.h"
#include "tutti/v1/plan.pb.h"

namespace tutti::stager {

class PlanIntake {
 public:
  // ahead: window + stage_ahead, the steps whose plans are held from the
  // window's first step on.
  PlanIntake(uint64_t ahead, uint64_t total_steps, std::string config_fingerprint)
      : ahead_(ahead), total_steps_(total_steps), fingerprint_(std::move(config_fingerprint)) {}

  // One past the last step whose plan there is room for while the window
  // starts at `base`.
  uint64_t Limit(uint64_t base) const;
  uint64_t next() const { return next_; }
  uint64_t generation() const { return generation_; }
  // Nothing to ask for now: no room, or the packer cannot serve the next step.
  bool Blocked(uint64_t base) const;
  // "plans received up to step N" (or "none"), for messages.
  std::string Received() const;

  // The window moved to `step`: ask from there, in a new generation; the
  // packer's earlier error no longer applies.
  void Restart(uint64_t step);

  // What to do with a plan that arrived for `generation`.
  enum class Verdict {
    kTake,       // a new step: hand it to the window
    kHaveIt,     // already received (or before the window): ignore
    kStale,      // sent for an older generation: restart the stream
  };
  Verdict Classify(uint64_t step, uint64_t generation, uint64_t base) const;
  // Records the step as received and checks the plan against the job:
  // FAILED_PRECONDITION when its config fingerprint is another job's (the
  // packer restarted with another config).
  absl::Status Take(const v1::StepPlan& plan);

  // The packer cannot serve `step` (nor what follows); ignored when sent for
  // an older generation. The earliest such step is kept.
  void Failed(uint64_t step, const absl::Status& status, uint64_t generation);
  // The recorded failure, if any: the first step it covers and the packer's
  // status.
  const std::optional<std::pair<uint64_t, absl::Status>>& failure() const { return failure_; }
  bool Covers(uint64_t step) const { return failure_ && step >= failure_->first; }
  // For a client asking for `step`: the packer's failure with context, or OK.
  absl::Status ErrorFor(uint64_t step) const;
  // The failure as a batch of `step` fails with it (for slots waiting for a plan).
  absl::Status SlotError(uint64_t step) const;

 private:
  const uint64_t ahead_;
  const uint64_t total_steps_;  // 0 = open-ended
  const std::string fingerprint_;
  uint64_t next_ = 0;
  uint64_t generation_ = 0;
  std::optional<std::pair<uint64_t, absl::Status>> failure_;
};

// The shards this node stages for a plan: those of the local ranks' images,
// documents and audio, except shards named only by remote_load items (the
// packer staged those on another node, whose stager sends their members),
// then, with locality, the shards the step reads on other nodes that this
// node is home to (StepPlan.held_shards: its stager serves their members).
// Plan order (first use) is kept, each shard once; the pointers point into
// `plan`.
std::vector<const v1::ShardRef*> ShardsToStage(const v1::StepPlan& plan);

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_PLAN_INTAKE_H_
