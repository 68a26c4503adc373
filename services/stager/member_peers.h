// Where the member bytes of a remote_load item come from first: the stager
// of the node that holds its shard (the plan's holder), over FetchMembers.
// The core sees only this interface (no network I/O in the core); the
// daemon's implementation is PeerFetcher (peer_fetcher.h), tests inject
// doubles that delay, fail or corrupt.
#ifndef TUTTI_SERVICES_STAGER_MEMBER_PEERS_H_
#define TUTTI_SERVICES_STAGER_MEMBER_PEERS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tutti/v1/plan.pb.h"

namespace tutti::stager {

class MemberPeers {
 public:
  using Bytes = std::shared_ptr<std::string>;
  using Done = std::function<void(absl::StatusOr<Bytes>)>;

  virtual ~MemberPeers() = default;
  // Whether `node`'s stager can be asked (its address is known).
  virtual bool Knows(uint32_t node) const = 0;
  // Asks `node`'s stager for `member` of `shard`; `done` hears the bytes or
  // why not by `deadline` (on any thread; it must not block). The bytes are
  // as the holder read them: the caller checks them against the index.
  virtual void Fetch(uint32_t node, const v1::ShardRef& shard, const v1::MemberRef& member,
                     absl::Time deadline, Done done) = 0;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_MEMBER_PEERS_H_
