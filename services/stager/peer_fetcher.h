// MemberPeers over gRPC: FetchMembers to another node's tutti-stagerd at the
// address --peers gives for it, with the job's TLS and token (the same
// SecurityOptions the stager uses towards its packer). One channel per
// peer, made on first use; every call has the caller's deadline. A holder
// that answers it is still starting (no job from its packer yet: stagers of
// one job start together) is asked again every kStartingRetry until it
// answers otherwise or the deadline is near; any other failure is final.
//
// Thread-safe. Destroying it cancels the calls in flight and waits until
// each has told its caller.
#ifndef TUTTI_SERVICES_STAGER_PEER_FETCHER_H_
#define TUTTI_SERVICES_STAGER_PEER_FETCHER_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/security_options.h"
#include "services/stager/member_peers.h"
#include "services/stager/metrics.h"
#include "tutti/v1/stager.grpc.pb.h"

namespace tutti::stager {

// "0=host:port,1=host:port,..." (--peers): node -> its stager's gRPC
// address. INVALID_ARGUMENT naming the entry for a malformed one (no '=', a
// node that is no number, an empty address, a node named twice).
absl::StatusOr<std::map<uint32_t, std::string>> ParsePeers(const std::string& text);

// How long the fetcher waits before asking a starting holder again.
inline constexpr absl::Duration kStartingRetry = absl::Milliseconds(100);

class PeerFetcher final : public MemberPeers {
 public:
  // metrics may be null; it must outlive the fetcher's calls.
  PeerFetcher(std::map<uint32_t, std::string> peers, SecurityOptions security,
              StagerMetrics* metrics);
  ~PeerFetcher() override;

  // Known: a node --peers gives an address for.
  bool Knows(uint32_t node) const override;
  void Fetch(uint32_t node, const v1::ShardRef& shard, const v1::MemberRef& member,
             absl::Time deadline, Done done) override;

  // Calls in flight and retries waiting (in the .cc) report here.
  class Call {
   public:
    virtual ~Call() = default;
    virtual void Cancel() = 0;
  };
  void Forget(Call* call);
  // Starts one FetchMembers call for a known node (after the retry pause
  // too); once the fetcher is being destroyed, `done` hears CANCELLED.
  void Launch(uint32_t node, const v1::ShardRef& shard, const v1::MemberRef& member,
              absl::Time deadline, Done done);
  // Waits kStartingRetry, then Launch; `done` hears CANCELLED if the fetcher
  // is destroyed meanwhile.
  void RetryLater(uint32_t node, const v1::ShardRef& shard, const v1::MemberRef& member,
                  absl::Time deadline, Done done);

 private:
  v1::Stager::Stub* StubOf(uint32_t node);
  // Registers `call` unless the fetcher is being destroyed (then false).
  bool Track(Call* call);

  const std::map<uint32_t, std::string> peers_;
  const SecurityOptions security_;
  StagerMetrics* const metrics_;
  absl::Mutex mu_;
  std::map<uint32_t, std::unique_ptr<v1::Stager::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  std::set<Call*> calls_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_PEER_FETCHER_H_
