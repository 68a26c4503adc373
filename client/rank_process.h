// This process at its node's stager: it registers as its rank
// (RegisterRank), keeps the incarnation and key the stager issued, and
// registers again when the stager answers that it does not know them (it
// restarted since). Every AcquireBatch, ReleaseBatch and RenewLeases of the
// process names Current().
//
// Thread-safe: Next(), the lease keeper's thread and batch releases use it.
// Registrations are serialised: threads that find the same incarnation
// unknown register once between them.
#ifndef TUTTI_CLIENT_RANK_PROCESS_H_
#define TUTTI_CLIENT_RANK_PROCESS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tutti/v1/stager.grpc.pb.h"

namespace tutti {

class RankProcess {
 public:
  struct Id {
    uint64_t incarnation = 0;
    std::string key;
  };

  // rpc_timeout: each RegisterRank call's deadline.
  RankProcess(std::shared_ptr<v1::Stager::Stub> stub, uint32_t rank, absl::Duration rpc_timeout)
      : stub_(std::move(stub)), rank_(rank), rpc_timeout_(rpc_timeout) {}

  // Registers (the first time, or again); the stager's status otherwise.
  absl::Status Register() ABSL_LOCKS_EXCLUDED(mu_);
  // After a call naming `stale` was answered that the stager does not know
  // it: registers again, unless another thread already did.
  absl::Status RegisterAgain(uint64_t stale) ABSL_LOCKS_EXCLUDED(mu_);
  Id Current() const ABSL_LOCKS_EXCLUDED(mu_);

  // The stager's answer to a call naming an incarnation it never issued
  // (NOT_FOUND naming kUnknownIncarnation): it restarted since.
  static bool Unknown(const absl::Status& status);

 private:
  absl::Status RegisterLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<v1::Stager::Stub> stub_;
  const uint32_t rank_;
  const absl::Duration rpc_timeout_;
  mutable absl::Mutex mu_;
  Id id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tutti

#endif  // TUTTI_CLIENT_RANK_PROCESS_H_
