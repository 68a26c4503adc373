#include "client/lease_keeper.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "common/log.h"

namespace tutti {
namespace {

const Logger kLog("client.leases");

}  // namespace

absl::Duration LeaseKeeper::IntervalFor(absl::Duration lease) {
  return std::max(lease / 4, absl::Milliseconds(50));
}

LeaseKeeper::LeaseKeeper(Renew renew, absl::Duration lease)
    : renew_(std::move(renew)), interval_(IntervalFor(lease)) {
  thread_ = std::thread([this] { Loop(); });
}

LeaseKeeper::~LeaseKeeper() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void LeaseKeeper::Hold(uint64_t step) {
  absl::MutexLock l(&mu_);
  Holds& h = held_[step];
  if (h.count++ == 0) h.since = ++holds_begun_;
  reported_lost_.erase(step);
}

void LeaseKeeper::Drop(uint64_t step) {
  absl::MutexLock l(&mu_);
  auto it = held_.find(step);
  if (it != held_.end() && --it->second.count <= 0) held_.erase(it);
}

absl::Status LeaseKeeper::Release(uint64_t step, const std::function<absl::Status()>& release) {
  Drop(step);
  return release();
}

uint64_t LeaseKeeper::lost_reported() const {
  absl::MutexLock l(&mu_);
  return lost_reported_;
}

std::vector<uint64_t> LeaseKeeper::Held() const {
  absl::MutexLock l(&mu_);
  std::vector<uint64_t> steps;
  for (const auto& [step, h] : held_) steps.push_back(step);
  return steps;
}

uint64_t LeaseKeeper::renewals() const {
  absl::MutexLock l(&mu_);
  return renewals_;
}

void LeaseKeeper::Loop() {
  LogRateLimit failures(absl::Minutes(1), 3);
  absl::MutexLock l(&mu_);
  absl::Time next = absl::Now() + interval_;
  while (!stop_) {
    mu_.AwaitWithDeadline(absl::Condition(&stop_), next);
    if (stop_) break;
    std::vector<uint64_t> steps;
    std::map<uint64_t, uint64_t> since;  // step -> the hold this renewal names
    for (const auto& [step, h] : held_) {
      steps.push_back(step);
      since[step] = h.since;
    }
    const absl::Duration interval = interval_;
    next = absl::Now() + interval;  // from the start of this renewal: a slow one delays none
    std::vector<uint64_t> lost;
    mu_.Unlock();
    absl::StatusOr<absl::Duration> lease = renew_(steps, interval, &lost);
    mu_.Lock();
    if (lease.ok()) {
      ++renewals_;
      if (*lease > absl::ZeroDuration()) interval_ = IntervalFor(*lease);
      for (uint64_t step : lost) {
        // Held throughout this renewal (not released, nor released and held again).
        auto h = held_.find(step);
        auto named = since.find(step);
        if (h == held_.end() || named == since.end() || h->second.since != named->second ||
            !reported_lost_.insert(step).second) {
          continue;
        }
        ++lost_reported_;
        kLog.Warning(
            "the stager no longer holds a batch this process holds (its lease lapsed while this "
            "process was not heard from, or the stager restarted): its memory may be reused",
            {{"step", step}});
      }
      continue;
    }
    const absl::Status& s = lease.status();
    if (absl::IsFailedPrecondition(s) || absl::IsUnimplemented(s)) {
      // A newer process serves this rank, or the stager has no leases: nothing to renew.
      kLog.Warning("lease renewals stop", {{"error", s.message()}});
      break;
    }
    if (uint64_t suppressed = 0; failures.Allow(&suppressed)) {
      kLog.Warning("a lease renewal failed; the next one follows at the usual interval",
                   {{"error", s.message()}, {"suppressed", suppressed}});
    }
  }
}

}  // namespace tutti
