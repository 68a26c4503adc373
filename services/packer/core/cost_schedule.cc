#include "services/packer/core/cost_schedule.h"

#include <algorithm>

namespace tutti::packer {

CostSchedule::CostSchedule(std::vector<CostFitEntry> entries, uint64_t planned_through)
    : entries_(std::move(entries)), planned_(planned_through) {}

void CostSchedule::SetRecord(RecordFit fit, RecordReservation reservation, uint64_t reserve_chunk) {
  absl::MutexLock lock(&mu_);
  record_fit_ = std::move(fit);
  planned_.SetReserve(std::move(reservation), reserve_chunk);
}

std::optional<CostFitEntry> CostSchedule::AtLocked(uint64_t step) const {
  auto it = std::upper_bound(entries_.begin(), entries_.end(), step,
                             [](uint64_t s, const CostFitEntry& e) { return s < e.from_step; });
  if (it == entries_.begin()) return std::nullopt;
  return *(it - 1);
}

std::optional<CostFitEntry> CostSchedule::ForStep(uint64_t step) const {
  absl::MutexLock lock(&mu_);
  planned_.Note(step, "cost fit");
  return AtLocked(step);
}

std::optional<CostFitEntry> CostSchedule::At(uint64_t step) const {
  absl::MutexLock lock(&mu_);
  return AtLocked(step);
}

absl::StatusOr<CostFitEntry> CostSchedule::Announce(const CostModelOptions& cost,
                                                    uint64_t earliest) {
  absl::MutexLock lock(&mu_);
  if (!planned_.frozen().ok()) return planned_.frozen();
  CostFitEntry e;
  e.id = entries_.empty() ? 1 : entries_.back().id + 1;
  e.from_step = std::max(earliest, planned_.planned_through());
  if (!entries_.empty()) e.from_step = std::max(e.from_step, entries_.back().from_step + 1);
  e.cost = cost;
  if (record_fit_) {
    if (absl::Status s = record_fit_(e); !s.ok()) return s;
  }
  entries_.push_back(e);
  return e;
}

std::vector<CostFitEntry> CostSchedule::entries() const {
  absl::MutexLock lock(&mu_);
  return entries_;
}

std::optional<CostFitEntry> CostSchedule::latest() const {
  absl::MutexLock lock(&mu_);
  if (entries_.empty()) return std::nullopt;
  return entries_.back();
}

uint64_t CostSchedule::planned_through() const {
  absl::MutexLock lock(&mu_);
  return planned_.planned_through();
}

absl::Status CostSchedule::frozen() const {
  absl::MutexLock lock(&mu_);
  return planned_.frozen();
}

}  // namespace tutti::packer
