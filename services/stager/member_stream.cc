#include "services/stager/member_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace tutti::stager {
namespace {

const Logger kLog("stager.peers");

}  // namespace

absl::Status CheckFetchRequest(const v1::FetchMembersRequest& req) {
  if (req.shard().name().empty()) {
    return absl::InvalidArgumentError("FetchMembers names no shard (shard.name is empty)");
  }
  if (req.members_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FetchMembers for shard ", req.shard().name(), " names no member"));
  }
  if (req.members_size() > kMaxPeerMembers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FetchMembers names ", req.members_size(), " members of shard ", req.shard().name(),
        "; at most ", kMaxPeerMembers, " per call: split the request"));
  }
  uint64_t total = 0;
  for (const v1::MemberRef& m : req.members()) {
    if (m.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("FetchMembers names a member of shard ",
                                                     req.shard().name(), " without a name"));
    }
    if (m.size() > kMaxPeerMemberBytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("FetchMembers asks for member ", m.name(), " of shard ", req.shard().name(),
                       " of ", m.size(), " bytes; at most ", kMaxPeerMemberBytes,
                       " bytes per member are sent stager to stager: read it from the source"));
    }
    total += m.size();
  }
  if (total > kMaxPeerCallBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("FetchMembers asks for ", total, " bytes of shard ", req.shard().name(),
                     "; at most ", kMaxPeerCallBytes, " bytes per call: split the request"));
  }
  return absl::OkStatus();
}

MemberStream::MemberStream(StagerCore* core, std::shared_ptr<StagerMetrics> metrics,
                           v1::FetchMembersRequest req, absl::Time deadline, CallTicket ticket)
    : metrics_(std::move(metrics)), req_(std::move(req)), ticket_(std::move(ticket)) {
  {
    absl::MutexLock l(&mu_);
    reads_open_ = req_.members_size();
  }
  for (int i = 0; i < req_.members_size(); ++i) {
    core->ReadMemberForPeer(req_.shard(), req_.members(i), deadline,
                            [this, i](absl::StatusOr<MemberReader::Bytes> bytes, bool) {
                              Arrived(static_cast<uint32_t>(i), std::move(bytes));
                            });
  }
}

void MemberStream::Arrived(uint32_t index, absl::StatusOr<MemberReader::Bytes> bytes) {
  v1::FetchedMember out;
  out.set_index(index);
  if (bytes.ok()) {
    out.set_data(**bytes);
  } else {
    out.set_code(static_cast<int>(bytes.status().code()));
    out.set_error(std::string(bytes.status().message()));
    static LogRateLimit limit(absl::Seconds(10), 10);
    if (uint64_t suppressed = 0; limit.Allow(&suppressed)) {
      kLog.Warning(
          "a member asked for by another node's stager could not be read: it reads "
          "the source itself",
          {{"shard", req_.shard().name()},
           {"member", req_.members(static_cast<int>(index)).name()},
           {"from_node", req_.from_node()},
           {"error", bytes.status().ToString()},
           {"suppressed", suppressed}});
    }
  }
  grpc::ByteBuffer buffer;
  const absl::Status s = SerializeTo(out, &buffer);
  bool gone = false;
  Action act = Action::kNone;
  {
    absl::MutexLock l(&mu_);
    ++answered_;
    --reads_open_;
    if (s.ok() && !write_failed_) {
      if (bytes.ok() && metrics_) {
        metrics_->peer_served.Increment();
        metrics_->peer_bytes_sent.Increment(static_cast<double>((*bytes)->size()));
      } else if (metrics_) {
        metrics_->peer_served_failed.Increment();
      }
      ready_.push_back(std::move(buffer));
    }
    act = PumpLocked();
    gone = done_ && reads_open_ == 0;
  }
  if (gone) {
    delete this;
    return;
  }
  Act(act);
}

MemberStream::Action MemberStream::PumpLocked() {
  if (finished_ || write_in_flight_) return Action::kNone;
  if (!write_failed_ && !ready_.empty()) {
    writing_ = std::move(ready_.front());
    ready_.pop_front();
    write_in_flight_ = true;
    return Action::kWrite;
  }
  if (write_failed_) {
    finished_ = true;
    return Action::kCancel;
  }
  if (answered_ == req_.members_size()) {
    finished_ = true;
    return Action::kFinish;
  }
  return Action::kNone;
}

// Outside mu_: gRPC may run a reaction before these return.
void MemberStream::Act(Action act) {
  switch (act) {
    case Action::kNone:
      return;
    case Action::kWrite:
      // writing_ is not touched again until OnWriteDone (write_in_flight_).
      StartWrite(&writing_);
      return;
    case Action::kFinish:
      Finish(grpc::Status::OK);
      return;
    case Action::kCancel:
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the asking stager stopped reading"));
      return;
  }
}

void MemberStream::OnWriteDone(bool ok) {
  Action act;
  {
    absl::MutexLock l(&mu_);
    write_in_flight_ = false;
    if (!ok) {
      write_failed_ = true;
      ready_.clear();
    }
    act = PumpLocked();
  }
  Act(act);
}

void MemberStream::OnDone() {
  bool gone = false;
  {
    absl::MutexLock l(&mu_);
    done_ = true;
    gone = reads_open_ == 0;
  }
  if (gone) delete this;
}

}  // namespace tutti::stager
