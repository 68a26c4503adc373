#include "tools/bench_load.h"

#include <grpcpp/alarm.h>
#include <grpcpp/generic/generic_stub.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "tutti/v1/packer.grpc.pb.h"

namespace tutti::tools {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// What the clients of one round share: counters and the count still running.
struct RoundState {
  absl::Mutex mu;
  uint32_t running ABSL_GUARDED_BY(mu) = 0;
  std::atomic<uint64_t> unary{0}, streams{0}, plans{0}, errors{0};
  std::string first_error ABSL_GUARDED_BY(mu);

  void Fail(const grpc::Status& s, const char* what) {
    errors.fetch_add(1);
    absl::MutexLock l(&mu);
    if (first_error.empty()) {
      first_error = absl::StrCat(what, ": ", s.error_code(), " ", s.error_message());
    }
  }
  void ClientDone() {
    absl::MutexLock l(&mu);
    --running;
  }
};

class Client;

// The driver receives each plan whole but leaves it encoded: decoding is
// the client's work, not the packer's, and would cost this process, which
// shares the machine with the packer, more than the packer's answer. The
// calls are the real methods on the wire.
constexpr char kGetPlan[] = "/tutti.v1.Packer/GetPlan";
constexpr char kStreamPlans[] = "/tutti.v1.Packer/StreamPlans";
using UnaryStub = grpc::TemplatedGenericStub<v1::GetPlanRequest, grpc::ByteBuffer>;
using StreamStub = grpc::TemplatedGenericStub<v1::StreamPlansRequest, grpc::ByteBuffer>;

// One StreamPlans call (a server stream: one request, then the plans): reads
// every plan, timing each.
class StreamCall final : public grpc::ClientBidiReactor<v1::StreamPlansRequest, grpc::ByteBuffer> {
 public:
  StreamCall(Client* client, Clock::time_point start) : client_(client), last_(start) {}
  void Begin() {
    StartWriteLast(&req, grpc::WriteOptions());
    StartRead(&plan_);
    StartCall();
  }
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& s) override;

  grpc::ClientContext ctx;
  v1::StreamPlansRequest req;

 private:
  Client* const client_;
  Clock::time_point last_;
  grpc::ByteBuffer plan_;
  bool empty_ = false;  // a plan of no bytes arrived: counted as a failure
};

// One client: its own connection, `calls` calls in sequence.
class Client {
  struct Unary {
    grpc::ClientContext ctx;
    v1::GetPlanRequest req;
    grpc::ByteBuffer resp;
  };

 public:
  Client(std::shared_ptr<grpc::Channel> channel, const LoadOptions& o, uint32_t index,
         RoundState* round, Clock::time_point round_start)
      : unary_stub_(channel), stream_stub_(channel), o_(o), index_(index), round_(round) {
    const auto interval = std::chrono::nanoseconds(absl::ToInt64Nanoseconds(o.interval));
    first_due_ = round_start + interval * index / o.clients;
  }

  // Starts the next call when it is due (after an alarm if it is not yet),
  // or reports this client done.
  void Next() {
    mu_.Lock();
    if (cancelled_ || call_ == o_.calls) {
      mu_.Unlock();
      round_->ClientDone();
      return;
    }
    const auto interval = std::chrono::nanoseconds(absl::ToInt64Nanoseconds(o_.interval));
    const Clock::time_point now = Clock::now();
    const Clock::time_point due = interval.count() > 0 ? first_due_ + interval * call_ : now;
    if (due > now) {
      auto alarm = std::make_unique<grpc::Alarm>();
      grpc::Alarm* a = alarm.get();
      alarms_.push_back(std::move(alarm));
      mu_.Unlock();
      a->Set(std::chrono::system_clock::now() + (due - now), [this, due](bool) { Issue(due); });
      return;
    }
    mu_.Unlock();
    Issue(due);
  }

  // Starts the next call, due at `start`. The call is set up under the lock
  // and started after it (its callbacks take the lock).
  void Issue(Clock::time_point start) {
    const double late = Ms(start, Clock::now());
    mu_.Lock();
    late_ms_.push_back(late);
    if (cancelled_) {
      mu_.Unlock();
      round_->ClientDone();
      return;
    }
    const uint64_t span = o_.last_step - o_.first_step + 1;
    const uint64_t step = o_.first_step + (index_ + call_ * 7) % span;
    const uint32_t rank = index_ % o_.world_size;
    const auto deadline = std::chrono::system_clock::now() +
                          std::chrono::milliseconds(absl::ToInt64Milliseconds(o_.call_timeout));
    if (call_++ % 2 == 0) {
      auto call = std::make_unique<StreamCall>(this, start);
      call->ctx.set_deadline(deadline);
      call->req.set_start_step(step);
      call->req.set_end_step(std::min(step + o_.stream_plans, o_.last_step + 1));
      call->req.add_ranks(rank);
      call->req.set_world_size(o_.world_size);
      current_ = &call->ctx;
      StreamCall* c = call.get();
      streams_.push_back(std::move(call));
      mu_.Unlock();
      stream_stub_.PrepareBidiStreamingCall(&c->ctx, kStreamPlans, grpc::StubOptions(), c);
      c->Begin();
      return;
    }
    auto unary = std::make_unique<Unary>();
    unary->ctx.set_deadline(deadline);
    unary->req.set_step(step);
    unary->req.add_ranks(rank);
    unary->req.set_world_size(o_.world_size);
    Unary* u = unary.get();
    current_ = &u->ctx;
    unaries_.push_back(std::move(unary));
    mu_.Unlock();
    unary_stub_.UnaryCall(&u->ctx, kGetPlan, grpc::StubOptions(), &u->req, &u->resp,
                          [this, u, start](grpc::Status s) { OnUnaryDone(u, start, s); });
  }

  void OnUnaryDone(Unary* u, Clock::time_point start, grpc::Status s) {
    const size_t bytes = u->resp.Length();
    u->resp.Clear();  // only its arrival is measured
    if (s.ok() && bytes == 0) s = grpc::Status(grpc::StatusCode::DATA_LOSS, "an empty plan");
    if (s.ok()) {
      RecordUnary(Ms(start, Clock::now()));
      round_->unary.fetch_add(1);
      round_->plans.fetch_add(1);
    } else {
      round_->Fail(s, "GetPlan");
    }
    Next();
  }

  void Cancel() {
    absl::MutexLock l(&mu_);
    cancelled_ = true;
    if (current_ != nullptr) current_->TryCancel();
    for (auto& a : alarms_) a->Cancel();
  }

  void RecordUnary(double ms) {
    absl::MutexLock l(&mu_);
    unary_ms_.push_back(ms);
  }
  void RecordStream(double ms) {
    absl::MutexLock l(&mu_);
    stream_ms_.push_back(ms);
  }
  RoundState* round() { return round_; }

  // Valid once the round is over.
  const std::vector<double>& unary_ms() const { return unary_ms_; }
  const std::vector<double>& stream_ms() const { return stream_ms_; }
  const std::vector<double>& late_ms() const { return late_ms_; }

 private:
  UnaryStub unary_stub_;
  StreamStub stream_stub_;
  const LoadOptions& o_;
  const uint32_t index_;
  RoundState* const round_;
  absl::Mutex mu_;
  Clock::time_point first_due_;
  uint32_t call_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* current_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Calls are kept until the round ends: a reactor outlives its OnDone.
  std::vector<std::unique_ptr<StreamCall>> streams_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Unary>> unaries_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<grpc::Alarm>> alarms_ ABSL_GUARDED_BY(mu_);
  std::vector<double> unary_ms_ ABSL_GUARDED_BY(mu_);
  std::vector<double> stream_ms_ ABSL_GUARDED_BY(mu_);
  std::vector<double> late_ms_ ABSL_GUARDED_BY(mu_);
};

void StreamCall::OnReadDone(bool ok) {
  if (!ok) return;  // the stream ended; OnDone follows
  const Clock::time_point now = Clock::now();
  if (plan_.Length() == 0) empty_ = true;
  plan_.Clear();
  client_->RecordStream(Ms(last_, now));
  client_->round()->plans.fetch_add(1);
  last_ = now;
  StartRead(&plan_);
}

void StreamCall::OnDone(const grpc::Status& status) {
  const grpc::Status s =
      status.ok() && empty_ ? grpc::Status(grpc::StatusCode::DATA_LOSS, "an empty plan") : status;
  if (s.ok()) {
    client_->round()->streams.fetch_add(1);
  } else {
    client_->round()->Fail(s, "StreamPlans");
  }
  client_->Next();
}

}  // namespace

double Quantile(std::vector<double>* v, double p) {
  if (v->empty()) return 0;
  const size_t k = std::min(v->size() - 1, static_cast<size_t>(std::ceil(p * v->size())) - (p > 0));
  std::nth_element(v->begin(), v->begin() + k, v->end());
  return (*v)[k];
}

absl::StatusOr<std::unique_ptr<LoadDriver>> LoadDriver::Connect(const LoadOptions& options,
                                                                absl::Duration connect) {
  if (options.clients == 0 || options.world_size == 0 || options.calls == 0 ||
      options.last_step < options.first_step) {
    return absl::InvalidArgumentError(
        "bench load: clients, world_size and calls must be positive and last_step >= first_step");
  }
  std::unique_ptr<LoadDriver> d(new LoadDriver(options));
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(absl::ToInt64Milliseconds(connect));
  for (uint32_t i = 0; i < options.clients; ++i) {
    grpc::ChannelArguments args;
    // A connection per client, as separate ranks and nodes have; without this,
    // channels to one address share one connection.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("tutti.bench.client", static_cast<int>(i));
    d->channels_.push_back(
        grpc::CreateCustomChannel(options.target, grpc::InsecureChannelCredentials(), args));
  }
  for (uint32_t i = 0; i < options.clients; ++i) {
    if (!d->channels_[i]->WaitForConnected(deadline)) {
      return absl::UnavailableError(absl::StrCat("bench load: client ", i, " of ", options.clients,
                                                 " could not connect to ", options.target,
                                                 " within ", absl::FormatDuration(connect)));
    }
  }
  return d;
}

LoadRound LoadDriver::RunRound(uint32_t round) {
  RoundState state;
  std::vector<std::unique_ptr<Client>> clients;
  clients.reserve(options_.clients);
  const Clock::time_point start = Clock::now();
  for (uint32_t i = 0; i < options_.clients; ++i) {
    clients.push_back(std::make_unique<Client>(channels_[i], options_, i, &state, start));
  }
  {
    absl::MutexLock l(&state.mu);
    state.running = options_.clients;
  }
  for (auto& c : clients) c->Next();
  auto all_done = [&state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) { return state.running == 0; };
  state.mu.Lock();
  const bool finished =
      state.mu.AwaitWithTimeout(absl::Condition(&all_done), options_.round_timeout);
  state.mu.Unlock();
  if (!finished) {
    for (auto& c : clients) c->Cancel();
    state.mu.Lock();
    state.mu.Await(absl::Condition(&all_done));
    state.mu.Unlock();
  }
  LoadRound r;
  r.seconds = Ms(start, Clock::now()) / 1000;
  r.clients = options_.clients;
  r.unary_calls = state.unary.load();
  r.streams = state.streams.load();
  r.plans = state.plans.load();
  r.errors = state.errors.load();
  {
    absl::MutexLock l(&state.mu);
    r.first_error = state.first_error;
    if (!finished && r.first_error.empty()) {
      r.first_error =
          absl::StrCat("round ", round, " ran past ", absl::FormatDuration(options_.round_timeout));
    }
  }
  std::vector<double> unary, stream, all, late;
  for (const auto& c : clients) {
    late.insert(late.end(), c->late_ms().begin(), c->late_ms().end());
    unary.insert(unary.end(), c->unary_ms().begin(), c->unary_ms().end());
    stream.insert(stream.end(), c->stream_ms().begin(), c->stream_ms().end());
  }
  all = unary;
  all.insert(all.end(), stream.begin(), stream.end());
  r.p50_ms = Quantile(&all, 0.5);
  r.p99_ms = Quantile(&all, 0.99);
  r.max_ms = Quantile(&all, 1.0);
  r.unary_p50_ms = Quantile(&unary, 0.5);
  r.unary_p99_ms = Quantile(&unary, 0.99);
  r.stream_p50_ms = Quantile(&stream, 0.5);
  r.stream_p99_ms = Quantile(&stream, 0.99);
  r.late_p99_ms = Quantile(&late, 0.99);
  return r;
}

}  // namespace tutti::tools
