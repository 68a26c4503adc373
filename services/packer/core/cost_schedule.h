// The cost constants each step is planned with: the job config's, then the
// online fits (online_fit.h) from the step each was announced for.
//
// A plan is a pure function of its step, so a fit must never change a step
// that was planned already: the schedule notes every step a planner asks it
// about (the watermark), and a fit announced now takes effect no earlier
// than the step after the furthest one planned. Entries are only appended,
// with increasing from_step, so the answer for a step never changes once
// given. Two hooks make that survive a restart (cost_fit_record.h): a fit
// is recorded before it is appended (not appended when recording fails),
// and the watermark is recorded ahead of planning, a chunk of steps at a
// time; a schedule rebuilt from the record starts its watermark where the
// record's reservation ends, so its first fit lands after every step its
// predecessor may have planned. When a reservation cannot be recorded the
// schedule stops taking fits (Announce refuses) and plans go on with the
// entries it has.
//
// Thread-safe.
#ifndef TUTTI_SERVICES_PACKER_CORE_COST_SCHEDULE_H_
#define TUTTI_SERVICES_PACKER_CORE_COST_SCHEDULE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/cost_model.h"
#include "services/packer/core/planned_steps.h"

namespace tutti::packer {

struct CostFitEntry {
  uint32_t id = 0;         // 1, 2, ... in order
  uint64_t from_step = 0;  // in force from this step on
  CostModelOptions cost;
};

class CostSchedule {
 public:
  // `entries`: in id and from_step order (a record's). `planned_through`:
  // steps below it may have been planned already.
  explicit CostSchedule(std::vector<CostFitEntry> entries = {}, uint64_t planned_through = 0);

  // Called, under the schedule's lock, with a fit before it takes effect
  // and with a new reservation (steps below `through` may be planned) before
  // a step at or beyond the last one is given out. Reservations advance by
  // `reserve_chunk` steps. Set before any planner uses the schedule.
  using RecordFit = std::function<absl::Status(const CostFitEntry&)>;
  using RecordReservation = std::function<absl::Status(uint64_t through)>;
  void SetRecord(RecordFit fit, RecordReservation reservation, uint64_t reserve_chunk);

  // The fit in force at `step` (none: the job config's constants); notes
  // the step as planned.
  std::optional<CostFitEntry> ForStep(uint64_t step) const;
  // The same without noting the step (reading a schedule, not planning).
  std::optional<CostFitEntry> At(uint64_t step) const;

  // Appends a fit in force from max(earliest, the step after every step
  // planned so far). FAILED_PRECONDITION when the schedule no longer takes
  // fits; the record hook's error when the fit could not be recorded (it is
  // then not appended).
  absl::StatusOr<CostFitEntry> Announce(const CostModelOptions& cost, uint64_t earliest);

  std::vector<CostFitEntry> entries() const;
  std::optional<CostFitEntry> latest() const;
  uint64_t planned_through() const;
  // Why the schedule stopped taking fits (OK while it takes them).
  absl::Status frozen() const;

 private:
  std::optional<CostFitEntry> AtLocked(uint64_t step) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<CostFitEntry> entries_ ABSL_GUARDED_BY(mu_);
  mutable PlannedSteps planned_ ABSL_GUARDED_BY(mu_);
  RecordFit record_fit_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_COST_SCHEDULE_H_
