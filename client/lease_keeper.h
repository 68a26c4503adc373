// Keeps the leases of the batches a rank's process holds at its stager: a
// background thread names every step held (Hold, not yet Drop) in one renewal
// at an interval well below the stager's lease (a quarter of it), for as long
// as the keeper lives, holding something or not (a renewal also says the
// process is alive, e.g. while it waits in Next()). The stager frees a hold
// that is not renewed within the lease, and takes a rank whose process is
// silent for that long as gone; renewals keep both from happening to a live
// process however long it holds a batch.
//
// Only a step held from before a renewal until its answer is reported lost
// (a warning, once per step): a step released meanwhile is not (Release).
//
// The renewal itself (the RPC) is injected. Thread-safe.
#ifndef TUTTI_CLIENT_LEASE_KEEPER_H_
#define TUTTI_CLIENT_LEASE_KEEPER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tutti {

class LeaseKeeper {
 public:
  // Renews the holds of `steps` (every step held, possibly none), with
  // `timeout` for the call; returns the stager's lease (0: unchanged) and
  // fills *lost with the steps the stager no longer holds.
  using Renew = std::function<absl::StatusOr<absl::Duration>(
      const std::vector<uint64_t>& steps, absl::Duration timeout, std::vector<uint64_t>* lost)>;

  // lease: the stager's (StageStatus.lease_ms), > 0. Starts the thread.
  LeaseKeeper(Renew renew, absl::Duration lease);
  ~LeaseKeeper();  // stops the thread (a renewal in flight ends first)
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // The process holds (again) the batch of `step`; Drop once per Hold.
  void Hold(uint64_t step);
  void Drop(uint64_t step);
  // The process is done with one hold of `step`: it is dropped from the
  // renewals first, then `release` (the ReleaseBatch call) runs; its status
  // is returned. So a renewal that crossed the release at the stager (sent
  // naming the step, answered that the stager no longer holds it) reports
  // nothing lost.
  absl::Status Release(uint64_t step, const std::function<absl::Status()>& release);
  // The steps held now, in order.
  std::vector<uint64_t> Held() const;
  // Renewals that reached the stager so far.
  uint64_t renewals() const;
  // Steps reported lost so far (logged once each): held by this process
  // from before a renewal until its answer said the stager no longer holds them.
  uint64_t lost_reported() const;

  // A quarter of the lease, at least 50 ms.
  static absl::Duration IntervalFor(absl::Duration lease);

 private:
  void Loop();

  struct Holds {
    int count = 0;
    uint64_t since = 0;  // which hold began it (holds_begun_ then): a step dropped
                         // and held again is another hold
  };

  const Renew renew_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Holds> held_ ABSL_GUARDED_BY(mu_);  // step -> its holds
  uint64_t holds_begun_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<uint64_t> reported_lost_ ABSL_GUARDED_BY(mu_);  // logged once each
  uint64_t lost_reported_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration interval_ ABSL_GUARDED_BY(mu_);
  uint64_t renewals_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tutti

#endif  // TUTTI_CLIENT_LEASE_KEEPER_H_
