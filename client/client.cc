#include "client/client.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/lease_keeper.h"
#include "client/rank_process.h"
#include "common/grpc_status.h"
#include "common/rpc_security.h"
#include "common/status.h"
#include "tutti/v1/packer.grpc.pb.h"
#include "tutti/v1/stager.grpc.pb.h"

namespace tutti {
namespace {

// The longest one AcquireBatch asks the stager to wait; the stager accepts
// at least this (tutti-stagerd --max_acquire_timeout_ms >= 60000).
constexpr absl::Duration kAcquireWaitPerCall = absl::Seconds(60);

// Registrations again within one call (the stager restarting more than
// that during one call is reported as its error).
constexpr int kMaxRegistrationsPerCall = 3;

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

// The first of `names` set in the environment: (name, value), or empty.
std::pair<std::string, std::string> FirstEnv(const std::function<const char*(const char*)>& getenv,
                                             std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* v = getenv(name);
    if (v != nullptr && *v != '\0') return {name, v};
  }
  return {};
}

// Reports a waiting call's progress (ClientOptions.progress): at most once
// per interval, the first time one interval after the call began.
class ProgressReporter {
 public:
  ProgressReporter(const ClientOptions& o, int64_t step)
      : fn_(o.progress_interval > absl::ZeroDuration() ? o.progress : nullptr),
        interval_(o.progress_interval),
        step_(step),
        start_(absl::Now()),
        next_(start_ + interval_) {}

  bool on() const { return fn_ != nullptr; }
  // When the next report is due (never when off).
  absl::Time due() const { return on() ? next_ : absl::InfiniteFuture(); }
  // Reports `waiting_for` if a report is due.
  void Maybe(absl::string_view waiting_for) {
    const absl::Time now = absl::Now();
    if (!on() || now < next_) return;
    while (next_ <= now) next_ += interval_;
    fn_(WaitProgress{step_, absl::ToDoubleSeconds(now - start_), std::string(waiting_for)});
  }

 private:
  std::function<void(const WaitProgress&)> fn_;
  absl::Duration interval_;
  int64_t step_;
  absl::Time start_;
  absl::Time next_;
};

// What the stager says a batch still waits for, from its "the batch for step
// S rank R was not ready within D: ..." answer.
std::string StagerPending(absl::string_view message) {
  const size_t at = message.find("was not ready within ");
  const size_t colon = at == absl::string_view::npos ? at : message.find(": ", at);
  if (colon == absl::string_view::npos) return std::string(message);
  return absl::StrCat("the stager says: ", message.substr(colon + 2));
}

// The shortest interval between progress reports: Next() asks the stager
// again after each one.
constexpr absl::Duration kMinProgressInterval = absl::Milliseconds(100);

absl::Status PositiveDuration(absl::Duration d, const char* name) {
  if (d <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.", name, " must be positive, got ", absl::FormatDuration(d)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ClientOptions> ResolveClientOptions(
    ClientOptions opts, const std::function<const char*(const char*)>& getenv_fn,
    const std::function<bool(const char*)>& socket_exists_fn) {
  const std::function<const char*(const char*)> getenv =
      getenv_fn ? getenv_fn : [](const char* n) -> const char* { return std::getenv(n); };
  const std::function<bool(const char*)> socket_exists =
      socket_exists_fn ? socket_exists_fn : [](const char* path) {
        struct stat st;
        return ::stat(path, &st) == 0 && S_ISSOCK(st.st_mode);
      };
  if (opts.stager_address.empty()) opts.stager_address = FirstEnv(getenv, {"TUTTI_STAGER"}).second;
  if (opts.stager_address.empty() && socket_exists(kDefaultStagerSocket)) {
    opts.stager_address = absl::StrCat("unix://", kDefaultStagerSocket);
  }
  if (opts.stager_address.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no stager address: set TUTTI_STAGER=host:port or unix:///path (this node's "
        "tutti-stagerd) or ClientOptions.stager_address (Python: stager=...); there is no "
        "stager socket at the default ",
        kDefaultStagerSocket));
  }
  if (opts.packer_address.empty()) opts.packer_address = FirstEnv(getenv, {"TUTTI_PACKER"}).second;
  if (opts.packer_address.empty()) {
    return absl::InvalidArgumentError(
        "no packer address: set TUTTI_PACKER=host:port (the job's tutti-packerd) or "
        "ClientOptions.packer_address (Python: packer=...)");
  }
  auto env_int = [&](std::initializer_list<const char*> names, int64_t* out) -> absl::Status {
    auto [name, value] = FirstEnv(getenv, names);
    if (name.empty()) return absl::OkStatus();
    if (!absl::SimpleAtoi(value, out) || *out < 0) {
      return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, "='", value,
                                                     "' is not a non-negative integer"));
    }
    return absl::OkStatus();
  };
  if (opts.rank < 0) {
    int64_t rank = -1;
    RETURN_IF_ERROR(
        env_int({"TUTTI_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}, &rank));
    if (rank < 0) {
      return absl::InvalidArgumentError(
          "no rank: set TUTTI_RANK (torchrun, mpirun and srun set RANK / OMPI_COMM_WORLD_RANK / "
          "SLURM_PROCID, which are read too) or ClientOptions.rank (Python: rank=...)");
    }
    opts.rank = static_cast<int>(rank);
  }
  if (opts.world_size < 0) {
    int64_t world = -1;
    RETURN_IF_ERROR(
        env_int({"TUTTI_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"},
                &world));
    opts.world_size = static_cast<int>(world);
  }
  if (opts.world_size == 0) {
    return absl::InvalidArgumentError("world size 0: a job has at least one rank");
  }
  if (opts.world_size > 0 && opts.rank >= opts.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", opts.rank, " is outside world size ",
                                                   opts.world_size, " (ranks are 0..",
                                                   opts.world_size - 1, ")"));
  }
  if (opts.start_step < 0) {
    int64_t step = 0;
    RETURN_IF_ERROR(env_int({"TUTTI_START_STEP"}, &step));
    opts.start_step = step;
  }
  RETURN_IF_ERROR(PositiveDuration(opts.connect_timeout, "connect_timeout"));
  RETURN_IF_ERROR(PositiveDuration(opts.batch_timeout, "batch_timeout"));
  RETURN_IF_ERROR(PositiveDuration(opts.rpc_timeout, "rpc_timeout"));
  RETURN_IF_ERROR(PositiveDuration(opts.retry_budget, "retry_budget"));
  RETURN_IF_ERROR(PositiveDuration(opts.report_timeout, "report_timeout"));
  RETURN_IF_ERROR(PositiveDuration(opts.initial_backoff, "initial_backoff"));
  RETURN_IF_ERROR(PositiveDuration(opts.max_backoff, "max_backoff"));
  if (opts.progress_interval != absl::ZeroDuration() &&
      opts.progress_interval < kMinProgressInterval) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.progress_interval must be zero (no reports) or at least ",
                     absl::FormatDuration(kMinProgressInterval), ", got ",
                     absl::FormatDuration(opts.progress_interval)));
  }
  ASSIGN_OR_RETURN(opts.security, ResolveSecurityOptions(opts.security, getenv));
  return opts;
}

absl::StatusOr<uint32_t> CheckJobWorldSize(const v1::JobInfo& job, int rank, int world_size) {
  const uint32_t planned = job.config().world_size();
  const std::string job_name = job.config().job_id().empty()
                                   ? "the packer's job"
                                   : absl::StrCat("job '", job.config().job_id(), "'");
  if (planned == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        job_name,
        " has no world_size; set world_size in the job config and restart tutti-packerd"));
  }
  if (world_size > 0 && static_cast<uint32_t>(world_size) != planned) {
    return absl::FailedPreconditionError(
        absl::StrCat("world size mismatch: this client runs with ", world_size, " ranks but ",
                     job_name, " was planned for ", planned, " ranks; launch ", planned,
                     " ranks, or restart tutti-packerd with world_size: ", world_size));
  }
  if (rank < 0 || static_cast<uint32_t>(rank) >= planned) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " is outside ", job_name,
                                                      "'s ", planned, " ranks (0..", planned - 1,
                                                      "); check TUTTI_RANK"));
  }
  return planned;
}

struct Client::Impl {
  v1::JobInfo job;
  std::shared_ptr<v1::Stager::Stub> stager;
  // This process as the stager issued it (registered in Connect): named in
  // every call for the rank's batches. A new client for a rank registering
  // reclaims what an earlier, gone one of it held.
  std::shared_ptr<RankProcess> process;
  std::shared_ptr<v1::Packer::Stub> packer;
  // Renews the leases of the batches this process holds (null: the stager
  // has no leases). Shared with every Batch handed out, so renewals go on
  // while a batch outlives the client.
  std::shared_ptr<LeaseKeeper> leases;
};

Client::Client() : impl_(std::make_unique<Impl>()) {}

const v1::JobInfo& Client::job() const { return impl_->job; }

RetryPolicy Client::Policy(absl::Duration budget) const {
  return RetryPolicy{budget, options_.initial_backoff, options_.max_backoff};
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  ASSIGN_OR_RETURN(ClientOptions opts, ResolveClientOptions(options));
  std::unique_ptr<Client> c(new Client());
  c->options_ = opts;
  ClientIdentity me{opts.rank, ""};
  c->impl_->packer = std::shared_ptr<v1::Packer::Stub>(
      v1::Packer::NewStub(MakeSecureChannel(opts.packer_address, opts.security, me)));

  const std::string at_packer = absl::StrCat("GetJob from tutti-packerd at ", opts.packer_address);
  ProgressReporter progress(opts, -1);
  // A daemon that is not available yet (starting, or not there): reported.
  auto absent = [&](const char* daemon, const std::string& address, const absl::Status& r) {
    if (absl::IsUnavailable(r)) {
      progress.Maybe(absl::StrCat(daemon, " at ", address, " is not available yet: ", r.message()));
    }
    return r;
  };
  absl::Status s = RetryUnavailable(c->Policy(opts.connect_timeout), at_packer, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(opts.rpc_timeout));
    return absent(
        "tutti-packerd", opts.packer_address,
        FromGrpcStatus(c->impl_->packer->GetJob(&ctx, v1::GetJobRequest(), &c->impl_->job)));
  });
  if (absl::IsUnavailable(s)) {
    return absl::UnavailableError(absl::StrCat(s.message(),
                                               " (is tutti-packerd running there? "
                                               "check TUTTI_PACKER)"));
  }
  RETURN_IF_ERROR(Annotate(s, at_packer));
  ASSIGN_OR_RETURN(c->world_size_, CheckJobWorldSize(c->impl_->job, opts.rank, opts.world_size));
  c->rank_ = static_cast<uint32_t>(opts.rank);
  // The stager checks that this client acts only as its own rank, of this job.
  me.job_id = c->impl_->job.config().job_id();
  c->impl_->stager = std::shared_ptr<v1::Stager::Stub>(
      v1::Stager::NewStub(MakeSecureChannel(opts.stager_address, opts.security, me)));

  const std::string at_stager =
      absl::StrCat("GetStageStatus from tutti-stagerd at ", opts.stager_address);
  v1::StageStatus status;
  s = RetryUnavailable(c->Policy(opts.connect_timeout), at_stager, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(opts.rpc_timeout));
    return absent("tutti-stagerd", opts.stager_address,
                  FromGrpcStatus(c->impl_->stager->GetStageStatus(&ctx, v1::GetStageStatusRequest(),
                                                                  &status)));
  });
  if (absl::IsUnavailable(s)) {
    return absl::UnavailableError(absl::StrCat(s.message(),
                                               " (is this node's tutti-stagerd "
                                               "running there? check TUTTI_STAGER)"));
  }
  RETURN_IF_ERROR(Annotate(s, at_stager));
  auto process = std::make_shared<RankProcess>(c->impl_->stager, c->rank_, opts.rpc_timeout);
  c->impl_->process = process;
  const std::string at_register =
      absl::StrCat("RegisterRank with tutti-stagerd at ", opts.stager_address);
  RETURN_IF_ERROR(Annotate(RetryUnavailable(c->Policy(opts.connect_timeout), at_register,
                                            [&] { return process->Register(); }),
                           at_register));
  if (status.lease_ms() > 0) {
    auto renew = [stub = c->impl_->stager, rank = c->rank_, process](
                     const std::vector<uint64_t>& steps, absl::Duration timeout,
                     std::vector<uint64_t>* lost) -> absl::StatusOr<absl::Duration> {
      for (int registered = 0;; ++registered) {
        const RankProcess::Id me = process->Current();
        grpc::ClientContext ctx;
        ctx.set_deadline(Deadline(timeout));
        v1::RenewLeasesRequest req;
        req.set_rank(rank);
        req.set_incarnation(me.incarnation);
        req.set_key(me.key);
        for (uint64_t step : steps) req.add_steps(step);
        v1::RenewLeasesResponse resp;
        const absl::Status s = FromGrpcStatus(stub->RenewLeases(&ctx, req, &resp));
        if (RankProcess::Unknown(s) && registered < kMaxRegistrationsPerCall) {
          // The stager restarted since this process registered.
          RETURN_IF_ERROR(process->RegisterAgain(me.incarnation));
          continue;
        }
        RETURN_IF_ERROR(s);
        lost->assign(resp.lost().begin(), resp.lost().end());
        return absl::Milliseconds(resp.lease_ms());
      }
    };
    c->impl_->leases =
        std::make_shared<LeaseKeeper>(std::move(renew), absl::Milliseconds(status.lease_ms()));
  }
  c->next_step_ = static_cast<uint64_t>(opts.start_step);
  return c;
}

Client::~Client() = default;

absl::StatusOr<Batch> Client::Next() {
  const uint64_t step = next_step_;
  const std::string where = absl::StrCat(
      ExchangeWhere(step, rank_), ": AcquireBatch from tutti-stagerd at ", options_.stager_address);
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options_.batch_timeout;
  v1::BatchDescriptor desc;
  ProgressReporter progress(options_, static_cast<int64_t>(step));
  RankProcess::Id me;  // the process the batch was handed to
  int registered = 0;
  absl::Status s = RetryUnavailable(Policy(options_.batch_timeout), where, [&]() -> absl::Status {
    while (true) {
      const absl::Time now = absl::Now();
      const absl::Duration left = deadline - now;
      if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("out of time");
      // The stager bounds one wait (--max_acquire_timeout_ms, at least a
      // minute): a longer batch_timeout is asked for a minute at a time; with
      // progress reports, until the next report is due.
      absl::Duration wait = std::min(left, kAcquireWaitPerCall);
      if (progress.on()) {
        wait = std::min(wait, std::max(progress.due() - now, kMinProgressInterval));
      }
      grpc::ClientContext ctx;
      // The stager waits up to timeout_ms for the batch; the RPC gets a little more.
      ctx.set_deadline(Deadline(wait + absl::Seconds(5)));
      v1::AcquireBatchRequest req;
      req.set_step(step);
      req.set_rank(rank_);
      me = impl_->process->Current();
      req.set_incarnation(me.incarnation);
      req.set_key(me.key);
      req.set_renews_leases(impl_->leases != nullptr);
      req.set_timeout_ms(
          static_cast<uint32_t>(std::max<int64_t>(1, absl::ToInt64Milliseconds(wait))));
      absl::Status r = FromGrpcStatus(impl_->stager->AcquireBatch(&ctx, req, &desc));
      if (RankProcess::Unknown(r) && registered++ < kMaxRegistrationsPerCall) {
        // The stager restarted since this process registered: again, then ask again.
        RETURN_IF_ERROR(impl_->process->RegisterAgain(me.incarnation));
        continue;
      }
      if (absl::IsDeadlineExceeded(r) && wait != left && absl::Now() < deadline) {
        // Time is left: ask again, whether the stager said what the batch
        // waits for or did not answer in time at all (stalled or overloaded).
        progress.Maybe(
            absl::StrContains(r.message(), "was not ready within")
                ? StagerPending(r.message())
                : absl::StrCat("tutti-stagerd at ", options_.stager_address, ": ", r.message()));
        continue;
      }
      if (absl::IsUnavailable(r)) {
        progress.Maybe(absl::StrCat("tutti-stagerd at ", options_.stager_address,
                                    " is not available: ", r.message()));
      }
      return r;
    }
  });
  if (absl::IsDeadlineExceeded(s)) {
    // The stager says what the batch still waits for (a plan, shards, a
    // rank not done with an earlier step, the window); a deadline that
    // expired in transit says nothing.
    const bool stager_reason = absl::StrContains(s.message(), "was not ready within");
    return absl::DeadlineExceededError(absl::StrCat(
        where, ": no batch within ", absl::FormatDuration(options_.batch_timeout),
        " (ClientOptions.batch_timeout)",
        stager_reason ? absl::StrCat(": ", s.message())
                      : "; the call's deadline passed before tutti-stagerd answered (the daemon "
                        "or the connection to it is stalled: see its log and metrics)"));
  }
  RETURN_IF_ERROR(Annotate(s, where));
  if (desc.step() != step || desc.rank() != rank_) {
    return absl::DataLossError(absl::StrCat(where, ": the stager answered with step ", desc.step(),
                                            ", rank ", desc.rank()));
  }
  // Held (and its lease renewed) until the release below is done with.
  if (impl_->leases) impl_->leases->Hold(step);
  // The wait as this rank saw it, sent with the release for the stager's metrics.
  auto waited = std::make_shared<double>(-1);
  auto releaser = [stub = impl_->stager, step, rank = rank_, me,
                   policy = Policy(options_.retry_budget), rpc_timeout = options_.rpc_timeout,
                   address = options_.stager_address, waited, leases = impl_->leases] {
    auto release = [&] {
      return RetryUnavailable(
          policy, absl::StrCat("ReleaseBatch to tutti-stagerd at ", address), [&] {
            grpc::ClientContext ctx;
            ctx.set_deadline(Deadline(rpc_timeout));
            v1::ReleaseBatchRequest req;
            req.set_step(step);
            req.set_rank(rank);
            req.set_incarnation(me.incarnation);
            req.set_key(me.key);
            if (*waited >= 0) req.set_wait_seconds(*waited);
            v1::ReleaseBatchResponse resp;
            const absl::Status s = FromGrpcStatus(stub->ReleaseBatch(&ctx, req, &resp));
            // A stager restarted since holds nothing of this process: nothing to release.
            return RankProcess::Unknown(s) ? absl::OkStatus() : s;
          });
    };
    // Renewals stop naming the step before the release is sent.
    return leases ? leases->Release(step, release) : release();
  };
  ASSIGN_OR_RETURN(Batch batch,
                   Batch::Map(std::move(desc), std::move(releaser), options_.copy_on_write));
  *waited = absl::ToDoubleSeconds(absl::Now() - start);
  batch.set_wait_seconds(*waited);
  total_wait_seconds_ += *waited;
  ++next_step_;
  return batch;
}

absl::Status Client::ReportTiming(uint64_t step, const std::vector<PhaseTime>& phases) {
  v1::StepTimingReport report;
  report.set_step(step);
  report.set_rank(rank_);
  for (const auto& [phase, seconds] : phases) {
    v1::PhaseTiming* t = report.add_phases();
    t->set_phase(phase);
    t->set_seconds(seconds);
  }
  const absl::Duration attempt_timeout = std::min(options_.rpc_timeout, options_.report_timeout);
  return RetryUnavailable(
      Policy(options_.report_timeout),
      absl::StrCat(ExchangeWhere(step, rank_), ": ReportTiming to tutti-packerd at ",
                   options_.packer_address),
      [&] {
        grpc::ClientContext ctx;
        ctx.set_deadline(Deadline(attempt_timeout));
        v1::ReportTimingResponse resp;
        return FromGrpcStatus(impl_->packer->ReportTiming(&ctx, report, &resp));
      });
}

absl::Status Client::Exchange(const v1::RankPlan& plan, uint64_t step, const void* send,
                              size_t send_bytes, void* recv, size_t recv_bytes) {
  if (transport_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(ExchangeWhere(step, rank_),
                     ": no transport; call SetTransport(MpiTransport::CreateWorld()) first"));
  }
  return transport_->Exchange(plan, send, send_bytes, recv, recv_bytes,
                              ExchangeContext{step, world_size_});
}

absl::Status Client::ExchangeLoad(const v1::RankPlan& plan, uint64_t step, const void* send,
                                  size_t send_bytes, void* recv, size_t recv_bytes) {
  if (transport_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(ExchangeWhere(step, rank_),
                     ": no transport; call SetTransport(MpiTransport::CreateWorld()) first"));
  }
  return transport_->ExchangeLoad(plan, send, send_bytes, recv, recv_bytes,
                                  ExchangeContext{step, world_size_});
}

absl::Status Client::ExchangeBackward(const v1::RankPlan& plan, uint64_t step, const void* send,
                                      size_t send_bytes, void* recv, size_t recv_bytes) {
  if (transport_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(ExchangeWhere(step, rank_),
                     ": no transport; call SetTransport(MpiTransport::CreateWorld()) first"));
  }
  return transport_->ExchangeBackward(plan, send, send_bytes, recv, recv_bytes,
                                      ExchangeContext{step, world_size_});
}

absl::Status Client::Exchange(const Batch& batch, const void* send, size_t send_bytes, void* recv,
                              size_t recv_bytes) {
  return Exchange(batch.plan(), batch.step(), send, send_bytes, recv, recv_bytes);
}

absl::Status Client::ExchangeBackward(const Batch& batch, const void* send, size_t send_bytes,
                                      void* recv, size_t recv_bytes) {
  return ExchangeBackward(batch.plan(), batch.step(), send, send_bytes, recv, recv_bytes);
}

}  // namespace tutti
