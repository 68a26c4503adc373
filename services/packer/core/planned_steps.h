// How far a schedule's steps may have been planned (cost_schedule.h,
// locality_schedule.h), and the reservation its record keeps ahead of them:
// a change announced to a schedule takes effect from the first step not yet
// planned, and a packer restarted from the record must know that step, so
// before a step at or beyond the recorded reservation is given out the
// reservation moves on by a chunk of steps. When it cannot be recorded the
// schedule freezes: beyond the recorded reservation a successor could not
// know what was planned, so no change may land there any more.
//
// Not thread-safe: its owner keeps it under its own lock.
#ifndef TUTTI_SERVICES_PACKER_CORE_PLANNED_STEPS_H_
#define TUTTI_SERVICES_PACKER_CORE_PLANNED_STEPS_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tutti::packer {

class PlannedSteps {
 public:
  // Records that steps below `through` may be planned.
  using Reserve = std::function<absl::Status(uint64_t through)>;

  // Steps below `planned_through` may have been planned already.
  explicit PlannedSteps(uint64_t planned_through = 0)
      : planned_through_(planned_through), reserved_through_(planned_through) {}

  // Reservations advance by `chunk` steps (at least 1).
  void SetReserve(Reserve reserve, uint64_t chunk) {
    reserve_ = std::move(reserve);
    chunk_ = std::max<uint64_t>(1, chunk);
  }

  // `step` is being planned. `change` names what a freeze stops ("cost
  // fit", "node change").
  void Note(uint64_t step, absl::string_view change) {
    if (step < planned_through_) return;
    if (reserve_ && frozen_.ok() && step >= reserved_through_) {
      const uint64_t through = step + chunk_;
      if (absl::Status s = reserve_(through); s.ok()) {
        reserved_through_ = through;
      } else {
        frozen_ = absl::FailedPreconditionError(
            absl::StrCat("the planned steps could not be recorded (", s.message(), "); no further ",
                         change, " takes effect"));
      }
    }
    planned_through_ = step + 1;
  }

  // Steps below it may have been planned: where a change takes effect.
  uint64_t planned_through() const { return planned_through_; }
  // Why changes are no longer taken (OK while they are).
  const absl::Status& frozen() const { return frozen_; }

 private:
  uint64_t planned_through_ = 0;
  uint64_t reserved_through_ = 0;
  absl::Status frozen_;
  Reserve reserve_;
  uint64_t chunk_ = 256;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_PLANNED_STEPS_H_
