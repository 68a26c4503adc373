#include "services/stager/peer_fetcher.h"

#include <grpcpp/alarm.h>

#include <chrono>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc_status.h"
#include "common/rpc_security.h"
#include "services/stager/member_stream.h"

namespace tutti::stager {
namespace {

// One FetchMembers call for one member: the stream's messages collected,
// `done` told once the call ends. Deletes itself in OnDone.
class FetchCall final : public grpc::ClientReadReactor<v1::FetchedMember>,
                        public PeerFetcher::Call {
 public:
  FetchCall(PeerFetcher* owner, uint32_t node, std::string address, const v1::ShardRef& shard,
            const v1::MemberRef& member, absl::Time deadline, MemberPeers::Done done,
            StagerMetrics* metrics)
      : owner_(owner),
        node_(node),
        address_(std::move(address)),
        deadline_(deadline),
        done_(std::move(done)),
        metrics_(metrics) {
    *req_.mutable_shard() = shard;
    *req_.add_members() = member;
    ctx_.set_deadline(absl::ToChronoTime(deadline));
  }

  void Cancel() override { ctx_.TryCancel(); }

  // Never started (the fetcher is being destroyed): `done` hears so.
  void Abandon() {
    done_(absl::CancelledError(
        absl::StrCat("this stager is stopping: member ", req_.members(0).name(), " of shard ",
                     req_.shard().name(), " not asked of node ", node_, "'s stager")));
    delete this;
  }

  void Start(v1::Stager::Stub* stub) {
    stub->async()->FetchMembers(&ctx_, &req_, this);
    StartRead(&msg_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows
    if (msg_.index() == 0 && !got_) {
      got_ = true;
      if (msg_.code() == 0) {
        bytes_ = std::make_shared<std::string>(std::move(*msg_.mutable_data()));
      } else {
        error_ = absl::Status(static_cast<absl::StatusCode>(msg_.code()), msg_.error());
      }
    }
    StartRead(&msg_);
  }

  void OnDone(const grpc::Status& s) override {
    if (!s.ok() && Starting() && absl::Now() + kStartingRetry < deadline_) {
      owner_->RetryLater(node_, req_.shard(), req_.members(0), deadline_, std::move(done_));
      owner_->Forget(this);
      delete this;
      return;
    }
    absl::StatusOr<MemberPeers::Bytes> out;
    const std::string who = absl::StrCat("node ", node_, "'s stager at ", address_);
    const std::string what =
        absl::StrCat("member ", req_.members(0).name(), " of shard ", req_.shard().name());
    if (bytes_ && s.ok()) {
      if (metrics_) metrics_->peer_bytes_received.Increment(static_cast<double>(bytes_->size()));
      out = std::move(bytes_);
    } else if (got_ && !error_.ok()) {
      out = absl::Status(error_.code(),
                         absl::StrCat(who, " could not read ", what, ": ", error_.message()));
    } else if (!s.ok()) {
      out = absl::Status(FromGrpcStatus(s).code(),
                         absl::StrCat(who, " did not send ", what, ": ", s.error_message()));
    } else {
      out = absl::DataLossError(absl::StrCat(who, " ended the stream without ", what));
    }
    done_(std::move(out));
    owner_->Forget(this);
    delete this;
  }

 private:
  // The holder said it has no job yet (member_stream.h kPeerStartingKey).
  bool Starting() const { return ctx_.GetServerTrailingMetadata().count(kPeerStartingKey) > 0; }

  PeerFetcher* const owner_;
  const uint32_t node_;
  const std::string address_;
  const absl::Time deadline_;
  MemberPeers::Done done_;
  StagerMetrics* const metrics_;
  grpc::ClientContext ctx_;
  v1::FetchMembersRequest req_;
  v1::FetchedMember msg_;
  bool got_ = false;
  MemberPeers::Bytes bytes_;
  absl::Status error_;
};

// A starting holder asked again after kStartingRetry. Deletes itself once
// the alarm has fired or been cancelled.
class RetryCall final : public PeerFetcher::Call {
 public:
  RetryCall(PeerFetcher* owner, uint32_t node, const v1::ShardRef& shard,
            const v1::MemberRef& member, absl::Time deadline, MemberPeers::Done done)
      : owner_(owner),
        node_(node),
        shard_(shard),
        member_(member),
        deadline_(deadline),
        done_(std::move(done)) {}

  void Start() {
    alarm_.Set(absl::ToChronoTime(absl::Now() + kStartingRetry), [this](bool ok) {
      if (ok) {
        owner_->Launch(node_, shard_, member_, deadline_, std::move(done_));
      } else {
        done_(absl::CancelledError(absl::StrCat("node ", node_,
                                                "'s stager was starting and this stager is "
                                                "stopping: read the source")));
      }
      owner_->Forget(this);
      delete this;
    });
  }
  void Cancel() override { alarm_.Cancel(); }
  // Never set (the fetcher is being destroyed): `done` hears so.
  void Abandon() {
    done_(absl::CancelledError(absl::StrCat(
        "node ", node_, "'s stager was starting and this stager is stopping: read the source")));
    delete this;
  }

 private:
  PeerFetcher* const owner_;
  const uint32_t node_;
  const v1::ShardRef shard_;
  const v1::MemberRef member_;
  const absl::Time deadline_;
  MemberPeers::Done done_;
  grpc::Alarm alarm_;
};

}  // namespace

absl::StatusOr<std::map<uint32_t, std::string>> ParsePeers(const std::string& text) {
  std::map<uint32_t, std::string> out;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(entry, '=');
    uint32_t node = 0;
    if (entry.find('=') == absl::string_view::npos || !absl::SimpleAtoi(kv.first, &node) ||
        kv.second.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--peers entry '", entry,
          "' is not NODE=HOST:PORT (e.g. --peers 0=10.0.0.1:7071,1=", "10.0.0.2:7071)"));
    }
    if (!out.emplace(node, std::string(kv.second)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peers names node ", node, " twice; give each node one address"));
    }
  }
  return out;
}

PeerFetcher::PeerFetcher(std::map<uint32_t, std::string> peers, SecurityOptions security,
                         StagerMetrics* metrics)
    : peers_(std::move(peers)), security_(std::move(security)), metrics_(metrics) {}

PeerFetcher::~PeerFetcher() {
  absl::MutexLock l(&mu_);
  stopping_ = true;
  for (Call* call : calls_) call->Cancel();
  mu_.Await(absl::Condition(
      +[](std::set<Call*>* calls) { return calls->empty(); }, &calls_));
}

bool PeerFetcher::Track(Call* call) {
  absl::MutexLock l(&mu_);
  if (stopping_) return false;
  calls_.insert(call);
  return true;
}

void PeerFetcher::Forget(Call* call) {
  absl::MutexLock l(&mu_);
  calls_.erase(call);
}

bool PeerFetcher::Knows(uint32_t node) const { return peers_.count(node) > 0; }

v1::Stager::Stub* PeerFetcher::StubOf(uint32_t node) {
  absl::MutexLock l(&mu_);
  auto& stub = stubs_[node];
  if (!stub) stub = v1::Stager::NewStub(MakeSecureChannel(peers_.at(node), security_));
  return stub.get();
}

void PeerFetcher::Fetch(uint32_t node, const v1::ShardRef& shard, const v1::MemberRef& member,
                        absl::Time deadline, Done done) {
  if (!Knows(node)) {
    done(absl::NotFoundError(
        absl::StrCat("no address for node ", node, "'s stager (--peers): read the source")));
    return;
  }
  Launch(node, shard, member, deadline, std::move(done));
}

void PeerFetcher::Launch(uint32_t node, const v1::ShardRef& shard, const v1::MemberRef& member,
                         absl::Time deadline, Done done) {
  v1::Stager::Stub* stub = StubOf(node);
  auto* call = new FetchCall(this, node, peers_.at(node), shard, member, deadline, std::move(done),
                             metrics_);
  if (!Track(call)) {
    call->Abandon();
    return;
  }
  call->Start(stub);
}

void PeerFetcher::RetryLater(uint32_t node, const v1::ShardRef& shard, const v1::MemberRef& member,
                             absl::Time deadline, Done done) {
  auto* retry = new RetryCall(this, node, shard, member, deadline, std::move(done));
  if (!Track(retry)) {
    retry->Abandon();
    return;
  }
  retry->Start();
}

}  // namespace tutti::stager
