#include "services/packer/core/locality_schedule.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tutti::packer {

absl::StatusOr<std::unique_ptr<LocalitySchedule>> LocalitySchedule::Create(
    std::shared_ptr<const Job> job, std::vector<LocalityChange> changes, uint64_t planned_through) {
  absl::StatusOr<std::shared_ptr<const HomeStaging>> homes =
      HomeStaging::Create(job->config(), job->index(), std::move(changes));
  if (!homes.ok()) return homes.status();
  return std::unique_ptr<LocalitySchedule>(
      new LocalitySchedule(std::move(job), *std::move(homes), planned_through));
}

LocalitySchedule::LocalitySchedule(std::shared_ptr<const Job> job,
                                   std::shared_ptr<const HomeStaging> homes,
                                   uint64_t planned_through)
    : job_(std::move(job)), homes_(std::move(homes)), planned_(planned_through) {}

void LocalitySchedule::SetRecord(RecordChanges changes, RecordReservation reservation,
                                 uint64_t reserve_chunk) {
  absl::MutexLock lock(&mu_);
  record_changes_ = std::move(changes);
  planned_.SetReserve(std::move(reservation), reserve_chunk);
}

std::shared_ptr<const HomeStaging> LocalitySchedule::Note(uint64_t step) const {
  absl::MutexLock lock(&mu_);
  planned_.Note(step, "node change");
  return homes_;
}

dispatch::ShardAvailability LocalitySchedule::At(uint64_t step) const {
  return Note(step)->At(step);
}

std::shared_ptr<const HomeStaging> LocalitySchedule::HomesFor(uint64_t step) const {
  return Note(step);
}

std::shared_ptr<const HomeStaging> LocalitySchedule::homes() const {
  absl::MutexLock lock(&mu_);
  return homes_;
}

absl::StatusOr<uint64_t> LocalitySchedule::Announce(std::vector<LocalityChange> changes,
                                                    uint64_t earliest) {
  // The homes are built outside the lock (tens of milliseconds at cluster
  // scale), so planners are not held up; built again if a planner moved the
  // watermark past the step meanwhile.
  while (true) {
    std::shared_ptr<const HomeStaging> base;
    uint64_t from = 0;
    {
      absl::MutexLock lock(&mu_);
      if (!planned_.frozen().ok()) return planned_.frozen();
      base = homes_;
      from = std::max(earliest, planned_.planned_through());
    }
    std::vector<LocalityChange> all = base->changes();
    for (LocalityChange& c : changes) {
      c.from_step = from;
      all.push_back(c);
    }
    absl::StatusOr<std::shared_ptr<const HomeStaging>> next =
        HomeStaging::Create(job_->config(), job_->index(), std::move(all));
    if (!next.ok()) return next.status();
    absl::MutexLock lock(&mu_);
    if (!planned_.frozen().ok()) return planned_.frozen();
    if (homes_ != base || std::max(earliest, planned_.planned_through()) != from) continue;
    if (record_changes_) {
      if (absl::Status s = record_changes_(changes); !s.ok()) return s;
    }
    homes_ = *std::move(next);
    return from;
  }
}

uint64_t LocalitySchedule::planned_through() const {
  absl::MutexLock lock(&mu_);
  return planned_.planned_through();
}

absl::Status LocalitySchedule::frozen() const {
  absl::MutexLock lock(&mu_);
  return planned_.frozen();
}

}  // namespace tutti::packer
