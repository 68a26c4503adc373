// The packer's request logic, without any network: checks what clients ask
// for against the job, hands out plans from the plan window as StepPlan
// messages and takes step timing reports. The gRPC handler
// (packer_service.h) only translates to and from this class.
//
// Threads: every method may be called from any thread; plan callbacks run on
// plan-window worker threads or inline.
#ifndef TUTTI_SERVICES_PACKER_PACKER_H_
#define TUTTI_SERVICES_PACKER_PACKER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/packer/core/cost_schedule.h"
#include "services/packer/core/job.h"
#include "services/packer/core/online_fit.h"
#include "services/packer/metrics.h"
#include "services/packer/plan_window.h"
#include "services/packer/served_plans.h"
#include "tutti/v1/packer.pb.h"

namespace tutti::packer {

// What a client says about itself in a plan request.
struct ClientView {
  uint32_t world_size = 0;         // 0: do not check
  std::string config_fingerprint;  // empty: do not check
  std::vector<uint32_t> ranks;     // empty: all ranks
};

struct StepTiming {
  uint64_t step = 0;
  uint32_t rank = 0;
  std::vector<std::pair<std::string, double>> phases;
  std::string config_fingerprint;  // empty: not checked
};

class Packer {
 public:
  // metrics may be null. served: bounds of the serialized plans kept
  // (keep_behind is raised to the job's plan window) and the rank sets
  // precomputed when the window has planned a step (on its worker thread).
  // `costs`: the schedule the window's planner reads, which the online fit
  // (job.proto CostFitConfig, when enabled) announces fits to; may be null
  // only when the fit is off. `window` and `costs` must outlive the Packer.
  Packer(std::shared_ptr<const Job> job, PlanWindow* window, PackerMetrics* metrics,
         ServedPlansOptions served = {}, CostSchedule* costs = nullptr);
  ~Packer();

  const v1::JobInfo& job_info() const { return job_info_; }
  const Job& job() const { return *job_; }

  // FAILED_PRECONDITION for a world size or fingerprint that does not match
  // the job; INVALID_ARGUMENT for a rank outside the world.
  absl::Status CheckClient(const ClientView& client) const;

  // The step plan for the client's ranks, built into *plan; `done` gets OK or
  // why not (OUT_OF_RANGE beyond the dataset's end, FAILED_PRECONDITION when
  // the step cannot be planned). *plan must stay alive until done runs.
  void GetPlan(uint64_t step, const ClientView& client, v1::StepPlan* plan,
               std::function<void(absl::Status)> done);

  // The same plan serialized (the bytes of a StepPlan message). The bytes of
  // a (step, rank set) are built once and kept (served_plans.h): asked
  // again, or asked while they are being built, the same bytes are served
  // without building or copying them.
  using PlanBytes = ServedPlans::Bytes;
  void GetPlanBytes(uint64_t step, const ClientView& client,
                    std::function<void(absl::StatusOr<PlanBytes>)> done);
  const ServedPlans& served_plans() const { return served_; }

  // Builds and keeps the served bytes of the configured rank sets
  // (ServedPlansOptions::precompute) of a planned step, while they fit in
  // the budget; returns how many were built. Run by the plan window's
  // workers as each step is planned.
  uint64_t Precompute(uint64_t step, const StepPlanData& data);

  // The last step a stream starting at `start` with `end` (0 = open) covers,
  // exclusive; OUT_OF_RANGE when `start` is already beyond the dataset.
  absl::StatusOr<uint64_t> StreamEnd(uint64_t start, uint64_t end) const;

  // Checks a report (rank, step, phases, the job's fingerprint) and counts
  // it; with the online fit on, pairs it with its step's plan (while the
  // window holds it) and fits when due. A fit round never fails a report.
  absl::Status ReportTiming(const StepTiming& timing);

  void CountServed(bool stream, const absl::Status& status);

 private:
  // The serialized plan of `key` (sorted ranks; empty: all) from `data`.
  absl::StatusOr<PlanBytes> Build(uint64_t step, const StepPlanData& data,
                                  const std::vector<uint32_t>& key);

  std::shared_ptr<const Job> job_;
  PlanWindow* window_;
  PackerMetrics* metrics_;
  v1::JobInfo job_info_;
  ServedPlans served_;
  std::atomic<bool> stopping_{false};  // set by the destructor: Precompute returns

  // The online fit's round over the reports so far.
  void RunFitRound() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CostSchedule* const costs_;
  absl::Mutex mu_;
  double fitted_vit_ ABSL_GUARDED_BY(mu_) = 0;  // seconds per unit of ViT cost (EMA)
  double fitted_llm_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<OnlineCostFit> fit_ ABSL_GUARDED_BY(mu_);  // null: the fit is off
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_PACKER_H_
