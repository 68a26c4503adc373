#include "services/stager/peer_fetcher.h"

#include <grpcpp/alarm.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc_status.h"
#include "common/rpc_security.h"
#include "services/stager/member_stream.h"

namespace tutti::stager {
namespace {

absl::Status Stopping(const v1::ShardRef& shard, const v1::MemberRef& member, uint32_t node) {
  return absl::CancelledError(absl::StrCat("this stager is stopping: member ", member.name(),
                                           " of shard ", shard.name(), " not asked of node ", node,
                                           "'s stager"));
}

// One FetchMembers call for members of one shard: each member's caller told
// as its message arrives, the others when the call ends. Deletes itself in
// OnDone.
class FetchCall final : public grpc::ClientReadReactor<v1::FetchedMember>,
                        public PeerFetcher::Call {
 public:
  FetchCall(PeerFetcher* owner, uint32_t node, std::string address, const v1::ShardRef& shard,
            std::vector<PeerFetcher::Asked> asked, StagerMetrics* metrics, bool wait_for_ready)
      : owner_(owner),
        node_(node),
        address_(std::move(address)),
        asked_(std::move(asked)),
        metrics_(metrics) {
    *req_.mutable_shard() = shard;
    deadline_ = absl::InfiniteFuture();
    for (const PeerFetcher::Asked& a : asked_) {
      *req_.add_members() = a.member;
      deadline_ = std::min(deadline_, a.deadline);
    }
    ctx_.set_deadline(absl::ToChronoTime(deadline_));
    ctx_.set_wait_for_ready(wait_for_ready);
  }

  void Cancel() override { ctx_.TryCancel(); }

  // Never started (the fetcher is being destroyed): each caller hears so.
  void Abandon() {
    for (PeerFetcher::Asked& a : asked_) a.done(Stopping(req_.shard(), a.member, node_));
    delete this;
  }

  void Start(v1::Stager::Stub* stub) {
    stub->async()->FetchMembers(&ctx_, &req_, this);
    StartRead(&msg_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows
    if (!reached_) {
      reached_ = true;
      owner_->Reached(node_);
    }
    const uint32_t i = msg_.index();
    if (i < asked_.size() && asked_[i].done) {
      MemberPeers::Done done = std::move(asked_[i].done);
      asked_[i].done = nullptr;
      if (msg_.code() == 0) {
        if (metrics_)
          metrics_->peer_bytes_received.Increment(static_cast<double>(msg_.data().size()));
        done(std::make_shared<std::string>(std::move(*msg_.mutable_data())));
      } else {
        done(absl::Status(static_cast<absl::StatusCode>(msg_.code()),
                          absl::StrCat(Who(), " could not read ", What(i), ": ", msg_.error())));
      }
    }
    StartRead(&msg_);
  }

  void OnDone(const grpc::Status& s) override {
    if (!reached_ && (s.ok() || Starting())) owner_->Reached(node_);
    std::vector<PeerFetcher::Asked> left;
    for (PeerFetcher::Asked& a : asked_) {
      if (a.done) left.push_back(std::move(a));
    }
    if (!left.empty() && !s.ok() && Starting() && absl::Now() + kStartingRetry < deadline_) {
      owner_->RetryLater(node_, req_.shard(), std::move(left));
    } else {
      for (size_t i = 0; i < left.size(); ++i) {
        const std::string what =
            absl::StrCat("member ", left[i].member.name(), " of shard ", req_.shard().name());
        left[i].done(
            s.ok()
                ? absl::DataLossError(absl::StrCat(Who(), " ended the stream without ", what))
                : absl::Status(FromGrpcStatus(s).code(), absl::StrCat(Who(), " did not send ", what,
                                                                      ": ", s.error_message())));
      }
    }
    owner_->Forget(this);
    delete this;
  }

 private:
  std::string Who() const { return absl::StrCat("node ", node_, "'s stager at ", address_); }
  std::string What(uint32_t i) const {
    return absl::StrCat("member ", req_.members(static_cast<int>(i)).name(), " of shard ",
                        req_.shard().name());
  }
  // The holder said it has no job yet (member_stream.h kPeerStartingKey).
  bool Starting() const { return ctx_.GetServerTrailingMetadata().count(kPeerStartingKey) > 0; }

  PeerFetcher* const owner_;
  const uint32_t node_;
  const std::string address_;
  std::vector<PeerFetcher::Asked> asked_;  // by index in the request; done null once told
  StagerMetrics* const metrics_;
  absl::Time deadline_;
  bool reached_ = false;  // a message arrived (the owner was told)
  grpc::ClientContext ctx_;
  v1::FetchMembersRequest req_;
  v1::FetchedMember msg_;
};

// A timer owned by the fetcher: `fire` runs when it expires, `cancelled`
// when the fetcher is destroyed first. Deletes itself after either.
class TimerCall final : public PeerFetcher::Call {
 public:
  TimerCall(PeerFetcher* owner, std::function<void()> fire, std::function<void()> cancelled)
      : owner_(owner), fire_(std::move(fire)), cancelled_(std::move(cancelled)) {}

  void Start(absl::Duration after) {
    alarm_.Set(absl::ToChronoTime(absl::Now() + after), [this](bool ok) {
      if (ok) {
        fire_();
      } else {
        cancelled_();
      }
      owner_->Forget(this);
      delete this;
    });
  }
  void Cancel() override { alarm_.Cancel(); }
  // Never set (the fetcher is being destroyed).
  void Abandon() {
    cancelled_();
    delete this;
  }

 private:
  PeerFetcher* const owner_;
  std::function<void()> fire_;
  std::function<void()> cancelled_;
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
  std::map<Key, Gathering> gathered;
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    gathered.swap(gathering_);
    for (Call* call : calls_) call->Cancel();
  }
  for (auto& [key, g] : gathered) {
    for (Asked& a : g.asked) a.done(Stopping(g.shard, a.member, key.first));
  }
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(
      +[](std::set<Call*>* calls) { return calls->empty(); }, &calls_));
}

bool PeerFetcher::Track(Call* call) {
  absl::MutexLock l(&mu_);
  if (stopping_) return false;
  calls_.insert(call);
  return true;
}

bool PeerFetcher::WaitForReady(uint32_t node) {
  absl::MutexLock l(&mu_);
  return reached_.count(node) == 0 && absl::Now() < made_ + kStartupGrace;
}

void PeerFetcher::Reached(uint32_t node) {
  absl::MutexLock l(&mu_);
  reached_.insert(node);
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
  if (member.size() > kMaxPeerMemberBytes) {
    done(absl::ResourceExhaustedError(absl::StrCat(
        "member ", member.name(), " of shard ", shard.name(), " has ", member.size(),
        " bytes; at most ", kMaxPeerMemberBytes, " are sent stager to stager: read the source")));
    return;
  }
  std::vector<Asked> full;  // a gathering at the call's bounds: sent now
  v1::ShardRef full_shard;
  uint64_t started = 0;  // a new gathering's id: its timer is set
  bool stopping = false;
  {
    absl::MutexLock l(&mu_);
    stopping = stopping_;
    if (!stopping) {
      const Key key(node, shard.name());
      auto it = gathering_.find(key);
      if (it != gathering_.end() &&
          (it->second.asked.size() >= static_cast<size_t>(kMaxPeerMembers) ||
           it->second.bytes + member.size() > kMaxPeerCallBytes)) {
        full = std::move(it->second.asked);
        full_shard = std::move(it->second.shard);
        gathering_.erase(it);
        it = gathering_.end();
      }
      if (it == gathering_.end()) {
        started = ++next_gathering_;
        it = gathering_.emplace(key, Gathering{started, shard, {}, 0}).first;
      }
      it->second.asked.push_back({member, deadline, std::move(done)});
      it->second.bytes += member.size();
    }
  }
  if (stopping) {
    done(Stopping(shard, member, node));
    return;
  }
  if (!full.empty()) Launch(node, full_shard, std::move(full));
  if (started != 0) {
    auto* timer = new TimerCall(
        this, [this, node, name = shard.name(), started] { Flush(node, name, started); },
        [] {});  // the destructor tells what was gathering
    if (Track(timer)) {
      timer->Start(kGatherMembers);
    } else {
      timer->Abandon();
    }
  }
}

void PeerFetcher::Flush(uint32_t node, const std::string& shard, uint64_t id) {
  Gathering g;
  {
    absl::MutexLock l(&mu_);
    auto it = gathering_.find(Key(node, shard));
    if (it == gathering_.end() || it->second.id != id) return;  // sent full, or stopping
    g = std::move(it->second);
    gathering_.erase(it);
  }
  Launch(node, g.shard, std::move(g.asked));
}

void PeerFetcher::Launch(uint32_t node, const v1::ShardRef& shard, std::vector<Asked> asked) {
  v1::Stager::Stub* stub = StubOf(node);
  auto* call = new FetchCall(this, node, peers_.at(node), shard, std::move(asked), metrics_,
                             WaitForReady(node));
  if (!Track(call)) {
    call->Abandon();
    return;
  }
  call->Start(stub);
}

void PeerFetcher::RetryLater(uint32_t node, const v1::ShardRef& shard, std::vector<Asked> asked) {
  auto held = std::make_shared<std::vector<Asked>>(std::move(asked));
  auto* timer = new TimerCall(
      this, [this, node, shard, held] { Launch(node, shard, std::move(*held)); },
      [node, shard, held] {
        for (Asked& a : *held) a.done(Stopping(shard, a.member, node));
      });
  if (Track(timer)) {
    timer->Start(kStartingRetry);
  } else {
    timer->Abandon();
  }
}

}  // namespace tutti::stager
