// MemberPeers over gRPC: FetchMembers to another node's tutti-stagerd at the
// address --peers gives for it, with the job's TLS and token (the same
// SecurityOptions the stager uses towards its packer). One channel per
// peer, made on first use. The members asked of one holder for one shard
// within kGatherMembers (a step's batches ask for theirs together) go in one
// call, up to the RPC's bounds (kMaxPeerMembers members, kMaxPeerCallBytes);
// the call's deadline is the earliest of its members', and each member's
// caller hears as soon as its message arrives, or at the call's end that it
// did not come (then the caller reads the source; a late message is
// dropped, so no member is read twice). A member above kMaxPeerMemberBytes
// is not asked (the holder would refuse the call). A holder
// that answers it is still starting (no job from its packer yet: stagers of
// one job start together) is asked again every kStartingRetry until it
// answers otherwise or the deadline is near; a holder that has not answered
// once yet, within kStartupGrace of the fetcher's start, is waited for up to
// the deadline when it cannot be connected to (its stager's process may
// start after this one); any other failure is final.
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
#include <utility>
#include <vector>

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
// How long after the fetcher is made a holder that has never answered is
// waited for rather than taken as gone.
inline constexpr absl::Duration kStartupGrace = absl::Seconds(60);
// How long a member asked of a holder waits for others of its shard to go
// in the same call.
inline constexpr absl::Duration kGatherMembers = absl::Milliseconds(2);

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

  // Calls in flight, gathering and retry timers (in the .cc) report here.
  class Call {
   public:
    virtual ~Call() = default;
    virtual void Cancel() = 0;
  };
  void Forget(Call* call);
  // One member asked for: its deadline and its caller.
  struct Asked {
    v1::MemberRef member;
    absl::Time deadline;
    Done done;
  };
  // Starts one FetchMembers call for `asked` (at most kMaxPeerMembers, of
  // one shard, of a known node); once the fetcher is being destroyed, each
  // hears CANCELLED.
  void Launch(uint32_t node, const v1::ShardRef& shard, std::vector<Asked> asked);
  // Waits kStartingRetry, then Launch; each hears CANCELLED if the fetcher
  // is destroyed meanwhile.
  void RetryLater(uint32_t node, const v1::ShardRef& shard, std::vector<Asked> asked);
  // The gathering batch `id` of (node, shard) is sent (its timer fired).
  void Flush(uint32_t node, const std::string& shard, uint64_t id);
  // `node`'s stager answered (it is up): from now on a failure to connect
  // to it is final.
  void Reached(uint32_t node);

 private:
  // Members of one shard waiting to be asked of one holder.
  struct Gathering {
    uint64_t id = 0;
    v1::ShardRef shard;
    std::vector<Asked> asked;
    uint64_t bytes = 0;
  };
  using Key = std::pair<uint32_t, std::string>;  // holder node, shard name

  v1::Stager::Stub* StubOf(uint32_t node);
  // Registers `call` unless the fetcher is being destroyed (then false).
  bool Track(Call* call);
  // A call to `node` waits for its connection (kStartupGrace).
  bool WaitForReady(uint32_t node);

  const std::map<uint32_t, std::string> peers_;
  const SecurityOptions security_;
  StagerMetrics* const metrics_;
  absl::Mutex mu_;
  std::map<uint32_t, std::unique_ptr<v1::Stager::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  std::set<Call*> calls_ ABSL_GUARDED_BY(mu_);
  std::map<Key, Gathering> gathering_ ABSL_GUARDED_BY(mu_);
  const absl::Time made_ = absl::Now();
  std::set<uint32_t> reached_ ABSL_GUARDED_BY(mu_);  // nodes whose stager answered
  uint64_t next_gathering_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_PEER_FETCHER_H_
