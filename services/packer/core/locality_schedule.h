// The shards' homes by step while the node set changes at run time: the
// changes the job started with (--node_removals, a locality record's) and
// those the packer announces as it learns that a node died, came back or
// has a smaller cache (node_liveness.h). It is the planner's ShardStaging.
//
// As with the cost fits (cost_schedule.h), a plan is a pure function of its
// step, so a change must never reach a step that was planned already: the
// schedule notes every step a planner asks it about (the watermark), and
// an announced change takes effect at the first step not yet planned (a
// step is served only once planned, so neither served). Steps in flight
// keep their homes; their remote loads from a dead holder fall back to the
// source at the stager. Changes are recorded before they take effect (not
// taken when recording fails) and the watermark is recorded ahead of
// planning, a chunk of steps at a time, so a schedule rebuilt from the
// record (locality_record.h) plans every step as before and its first
// change lands after every step its predecessor may have planned. When a
// reservation cannot be recorded the schedule stops taking changes and
// plans go on with the homes it has.
//
// Thread-safe.
#ifndef TUTTI_SERVICES_PACKER_CORE_LOCALITY_SCHEDULE_H_
#define TUTTI_SERVICES_PACKER_CORE_LOCALITY_SCHEDULE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/packer/core/home_staging.h"
#include "services/packer/core/job.h"
#include "services/packer/core/planned_steps.h"
#include "services/packer/core/planner.h"

namespace tutti::packer {

class LocalitySchedule final : public ShardStaging {
 public:
  // The job's homes (locality on: home_replication > 0) under `changes`
  // (--node_removals and a record's, in the order recorded). Steps below
  // `planned_through` may have been planned already. Errors as
  // HomeStaging::Create.
  static absl::StatusOr<std::unique_ptr<LocalitySchedule>> Create(
      std::shared_ptr<const Job> job, std::vector<LocalityChange> changes,
      uint64_t planned_through = 0);

  // Called under the schedule's lock with the changes of an announcement
  // before they take effect, and with a new reservation (steps below
  // `through` may be planned) before a step at or beyond the last one is
  // given out; reservations advance by `reserve_chunk` steps. Set before any
  // planner uses the schedule.
  using RecordChanges = std::function<absl::Status(const std::vector<LocalityChange>&)>;
  using RecordReservation = std::function<absl::Status(uint64_t through)>;
  void SetRecord(RecordChanges changes, RecordReservation reservation, uint64_t reserve_chunk);

  // ShardStaging: both note `step` as planned.
  dispatch::ShardAvailability At(uint64_t step) const override;
  std::shared_ptr<const HomeStaging> HomesFor(uint64_t step) const override;

  // The homes with every change so far (reading, not planning).
  std::shared_ptr<const HomeStaging> homes() const;

  // Takes `changes` (their from_step is set here) in force from the first
  // step not yet planned, or `earliest` when later, and returns that step.
  // Nothing is taken when: the homes with them do not fit the nodes'
  // capacities (RESOURCE_EXHAUSTED naming the bytes, from ShardHomes) or
  // leave no node (INVALID_ARGUMENT); the record hook fails (its error);
  // the schedule no longer takes changes (FAILED_PRECONDITION). The homes
  // are built without holding up planners (about 20 ms per change step at
  // 10,000 shards on 320 nodes); one caller at a time.
  absl::StatusOr<uint64_t> Announce(std::vector<LocalityChange> changes, uint64_t earliest = 0);

  uint64_t planned_through() const;
  // Why the schedule stopped taking changes (OK while it takes them).
  absl::Status frozen() const;

 private:
  LocalitySchedule(std::shared_ptr<const Job> job, std::shared_ptr<const HomeStaging> homes,
                   uint64_t planned_through);
  std::shared_ptr<const HomeStaging> Note(uint64_t step) const;

  const std::shared_ptr<const Job> job_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const HomeStaging> homes_ ABSL_GUARDED_BY(mu_);
  mutable PlannedSteps planned_ ABSL_GUARDED_BY(mu_);
  RecordChanges record_changes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_LOCALITY_SCHEDULE_H_
