// Per-rank identity on a daemon: a client acts only as the rank it connected
// as (its kRankKey metadata) and only within the job the daemon serves
// (kJobKey). A call for another rank's batches, or from another job's client,
// is refused with PERMISSION_DENIED naming the rank. Which process of a rank
// holds its batches (a restarted rank replacing its old process) is the
// requests' incarnation field, checked by the stager's batch window.
//
// The identity is what an authenticated client says it is: the job token,
// the client certificate or the Unix socket's peer credentials decide who
// may call at all; this decides which rank's batches a caller may touch.
//
// Identity is required on rank calls when the daemon checks job tokens
// (every tutti client sends it); without a token, a call that carries none
// is taken as is, as the tests' and tools' own loopback clients are.
//
// Thread-safe.
#ifndef TUTTI_COMMON_RANK_IDENTITY_H_
#define TUTTI_COMMON_RANK_IDENTITY_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/security_options.h"

namespace tutti {

class RankIdentities {
 public:
  // require: refuse rank calls without identity metadata.
  explicit RankIdentities(bool require) : require_(require) {}

  // The job the daemon serves (calls naming another are refused). Until it
  // is known, every rank call is refused UNAVAILABLE.
  void SetJob(std::string job_id) ABSL_LOCKS_EXCLUDED(mu_);

  // For a call by `caller` acting as `rank` (the rank in its request):
  // OK, or PERMISSION_DENIED naming the rank and why.
  absl::Status Admit(const ClientIdentity& caller, uint32_t rank) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const bool require_;
  mutable absl::Mutex mu_;
  bool known_ ABSL_GUARDED_BY(mu_) = false;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tutti

#endif  // TUTTI_COMMON_RANK_IDENTITY_H_
