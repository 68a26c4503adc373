// The holder's side of FetchMembers: another node's stager asks for members
// of a shard (remote_load items of its ranks' plans), and this stager sends
// their bytes as stored, one message per member, from its cache when the
// shard is staged here, else read from the source by this stager. The
// request's bounds are checked before anything is read (CheckFetchRequest).
//
// Thread-safety: a MemberStream is driven by gRPC's callbacks and the
// reader's; its state is under its own mutex.
#ifndef TUTTI_SERVICES_STAGER_MEMBER_STREAM_H_
#define TUTTI_SERVICES_STAGER_MEMBER_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc_gate.h"
#include "services/stager/metrics.h"
#include "services/stager/stager_core.h"
#include "tutti/v1/stager.pb.h"

namespace tutti::stager {

// Members one FetchMembers call may ask for.
// Trailing metadata of a FetchMembers call the holder refused because it
// has no job from its packer yet: the asking stager asks again shortly,
// within its deadline (peer_fetcher.h), instead of reading the source.
inline constexpr char kPeerStartingKey[] = "tutti-peer-starting";
inline constexpr int kMaxPeerMembers = 64;
// Bytes of one member, and of all the members of one call.
inline constexpr uint64_t kMaxPeerMemberBytes = 32ull << 20;
inline constexpr uint64_t kMaxPeerCallBytes = 64ull << 20;

// OK when `req` is within the bounds above and names a shard and members;
// INVALID_ARGUMENT (no members, too many, an unnamed shard) or
// RESOURCE_EXHAUSTED (too many bytes) naming the bound otherwise.
absl::Status CheckFetchRequest(const v1::FetchMembersRequest& req);

class MemberStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // Starts the reads at once (each with `deadline`); core and metrics must
  // outlive the call's reads (the server stops gRPC before the core's
  // reader goes).
  MemberStream(StagerCore* core, std::shared_ptr<StagerMetrics> metrics,
               v1::FetchMembersRequest req, absl::Time deadline, CallTicket ticket);

  void OnWriteDone(bool ok) override;
  void OnDone() override;
  void OnCancel() override {}

 private:
  enum class Action { kNone, kWrite, kFinish, kCancel };
  void Arrived(uint32_t index, absl::StatusOr<MemberReader::Bytes> bytes);
  // What to do next: the next write, or the end once every member was
  // answered (or the asking side stopped reading). Done by Act, unlocked.
  Action PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Act(Action act);

  const std::shared_ptr<StagerMetrics> metrics_;
  const v1::FetchMembersRequest req_;
  const CallTicket ticket_;
  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> ready_ ABSL_GUARDED_BY(mu_);
  // The message being written: set under mu_ when a write starts, then only
  // read by gRPC until OnWriteDone.
  grpc::ByteBuffer writing_;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  int answered_ ABSL_GUARDED_BY(mu_) = 0;    // members whose read completed
  int reads_open_ ABSL_GUARDED_BY(mu_) = 0;  // reads not completed yet
  bool done_ ABSL_GUARDED_BY(mu_) = false;   // OnDone ran: delete when reads_open_ is 0
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_MEMBER_STREAM_H_
