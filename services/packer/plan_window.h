// The plan window: steps planned ahead of the clients on worker threads.
//
// The window's head is the furthest step any client asked for; workers plan
// the steps [head, head + window) ahead, and any other step on demand (a
// lagging node, a restarted client). Finished plans are kept from
// head - window on; older ones are dropped and recomputed if asked for again
// (plans are pure functions of the step, so a recomputed plan is identical).
// A restarted packer starts with an empty window and its head moves to
// wherever the clients are.
//
// Threads: Get/Peek/Stop from any thread; `done` callbacks run on a worker
// thread (or inline in Get when the plan is ready) without the lock held.
#ifndef TUTTI_SERVICES_PACKER_PLAN_WINDOW_H_
#define TUTTI_SERVICES_PACKER_PLAN_WINDOW_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/packer/core/plan_data.h"
#include "services/packer/core/planner.h"
#include "services/packer/metrics.h"

namespace tutti::packer {

struct PlanWindowOptions {
  uint32_t window = 8;   // steps planned ahead (job config plan_window)
  uint32_t threads = 2;  // worker threads; each plans one step at a time
};

using PlanPtr = std::shared_ptr<const StepPlanData>;

class PlanWindow {
 public:
  using Done = std::function<void(absl::StatusOr<PlanPtr>)>;

  // metrics may be null.
  PlanWindow(std::shared_ptr<const Planner> planner, PlanWindowOptions options,
             PackerMetrics* metrics);
  ~PlanWindow();

  // Calls done with the plan of `step` (or why it cannot be planned) and
  // moves the head to `step` if it is further.
  void Get(uint64_t step, Done done);
  absl::StatusOr<PlanPtr> GetBlocking(uint64_t step);
  // The plan of `step` if already computed, else null (never computes).
  PlanPtr Peek(uint64_t step) const;
  // Fails pending requests with UNAVAILABLE and joins the workers.
  void Stop();
  bool stopping() const;

  // Called on a worker thread with each step it planned (after the step's
  // waiters got the plan), e.g. to prepare what clients will ask of it.
  // Replacing or clearing it waits for a call in progress to return.
  using Planned = std::function<void(uint64_t step, const PlanPtr& plan)>;
  void SetOnPlanned(Planned planned);

  uint64_t head() const;
  const Planner& planner() const { return *planner_; }

 private:
  enum class State { kQueued, kRunning, kDone };
  struct Entry {
    State state = State::kQueued;
    absl::Status status;
    PlanPtr plan;
    std::vector<Done> waiters;
  };

  void Worker();
  // A planned step's samples by source and the sources' epochs, to metrics.
  void CountSources(const StepPlanData& data);
  // Picks the next step to plan: asked-for steps first (lowest), then the
  // window ahead of the head. Returns false when there is nothing to do.
  bool NextStep(uint64_t* step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Evict() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateDepth() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<const Planner> planner_;
  const PlanWindowOptions options_;
  PackerMetrics* const metrics_;

  mutable absl::Mutex mu_;
  absl::CondVar work_;  // signalled when there may be a step to plan
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t head_ ABSL_GUARDED_BY(mu_) = 0;
  bool any_request_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Planned on_planned_ ABSL_GUARDED_BY(mu_);
  uint32_t planned_calls_ ABSL_GUARDED_BY(mu_) = 0;  // on_planned_ calls running
  std::vector<std::thread> workers_;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_PLAN_WINDOW_H_
