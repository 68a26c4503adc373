#include "services/stager/plan_client.h"

#include "common/rpc_security.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/log.h"

namespace tutti::stager {
namespace {

const Logger kLog("stager.plans");

bool Retryable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::CANCELLED ||
         code == grpc::StatusCode::DEADLINE_EXCEEDED || code == grpc::StatusCode::ABORTED ||
         code == grpc::StatusCode::RESOURCE_EXHAUSTED || code == grpc::StatusCode::UNKNOWN;
}

}  // namespace

PlanClient::PlanClient(std::string packer_address, StagerMetrics* metrics,
                       const SecurityOptions& security)
    : address_(std::move(packer_address)),
      metrics_(metrics),
      channel_(MakeSecureChannel(address_, security)),
      stub_(v1::Packer::NewStub(channel_)), health_(grpc::health::v1::Health::NewStub(channel_)) {}

PlanClient::~PlanClient() { Stop(); }

absl::StatusOr<v1::JobInfo> PlanClient::FetchJob(absl::Time give_up, const StopSignal* stop) {
  absl::Duration backoff = absl::Milliseconds(100);
  auto stopping = [&] { return stop_ || (stop != nullptr && stop->requested()); };
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext ctx;
    // Short attempts: a stop is noticed within one of them.
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    v1::JobInfo job;
    grpc::Status s = stub_->GetJob(&ctx, v1::GetJobRequest(), &job);
    if (s.ok()) return job;
    if (stopping()) return absl::CancelledError("stopped while waiting for the packer");
    if (!Retryable(s.error_code())) {
      return FromGrpcStatus(s, absl::StrCat("GetJob from the packer at ", address_));
    }
    if (absl::Now() + backoff > give_up) {
      return absl::UnavailableError(absl::StrCat(
          "the packer at ", address_, " did not answer GetJob (", s.error_message(),
          "); start tutti-packerd first or fix --packer"));
    }
    kLog.Info("packer not reachable yet; retrying",
              {{"packer", address_}, {"error", s.error_message()},
               {"retry_in", absl::FormatDuration(backoff)}, {"attempt", attempt}});
    if (stop != nullptr ? stop->SleepFor(backoff) : stopped_.WaitForNotificationWithTimeout(backoff)) {
      return absl::CancelledError("stopped while waiting for the packer");
    }
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

absl::Status PlanClient::CheckPacker(absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("tutti.v1.Packer");
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status s = health_->Check(&ctx, req, &resp);
  if (s.ok()) {
    if (resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("the packer at ", address_, " is not ready"));
  }
  // A packer without the health service (or without the name) still answered.
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED ||
      s.error_code() == grpc::StatusCode::NOT_FOUND) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat("the packer at ", address_, " does not answer: ", s.error_message()));
}

void PlanClient::Start(StagerCore* core) {
  core_ = core;
  thread_ = std::thread([this] { Run(); });
}

void PlanClient::Stop() {
  if (!stop_.exchange(true)) stopped_.Notify();
  {
    absl::MutexLock l(&mu_);
    if (stream_ctx_) stream_ctx_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

void PlanClient::Run() {
  const v1::JobInfo& job = core_->job();
  absl::Duration backoff = absl::Milliseconds(100);
  bool broken = false;  // the last stream broke (packer down or restarting)
  while (!stop_) {
    // Only the plans the core has room for: gRPC completes a write once it is
    // buffered, so an open-ended stream would let the packer run thousands of
    // steps ahead of the clients. Room appears as clients release batches.
    StagerCore::PlanWant want = core_->WaitPlanWanted(absl::Now() + absl::Milliseconds(200));
    if (want.stop || stop_) break;
    if (want.blocked) continue;
    v1::StreamPlansRequest req;
    req.set_start_step(want.step);
    req.set_end_step(want.end);
    for (uint32_t r : core_->local_ranks()) req.add_ranks(r);
    req.set_world_size(job.config().world_size());
    req.set_config_fingerprint(job.config_fingerprint());
    grpc::ClientContext ctx;
    {
      absl::MutexLock l(&mu_);
      if (stop_) break;
      stream_ctx_ = &ctx;
    }
    if (broken && metrics_) metrics_->packer_reconnects.Increment();
    auto reader = stub_->StreamPlans(&ctx, req);
    v1::StepPlan plan;
    uint64_t next = want.step;
    bool restart = false;
    while (reader->Read(&plan)) {
      backoff = absl::Milliseconds(100);
      broken = false;
      next = plan.step() + 1;
      absl::Status s = core_->AddPlan(std::move(plan), want.generation);
      if (absl::IsAborted(s) || absl::IsCancelled(s)) {
        restart = true;
        ctx.TryCancel();
        break;
      }
      plan = v1::StepPlan();
    }
    grpc::Status st = reader->Finish();
    {
      absl::MutexLock l(&mu_);
      stream_ctx_ = nullptr;
    }
    if (stop_ || restart) continue;
    if (st.ok()) {
      broken = false;
      if (next < want.end) {  // the packer clamped the range: its plans end there
        core_->PlanFailed(next, absl::OutOfRangeError(absl::StrCat(
                                    "the packer's plans end before step ", next, " (end of the dataset)")),
                          want.generation);
      }
      continue;
    }
    if (!Retryable(st.error_code())) {
      core_->PlanFailed(next, FromGrpcStatus(st, absl::StrCat("StreamPlans from ", address_)),
                        want.generation);
      continue;
    }
    broken = true;
    kLog.Warning("plan stream broke; reconnecting",
                 {{"packer", address_}, {"step", next}, {"error", st.error_message()},
                  {"retry_in", absl::FormatDuration(backoff)}});
    stopped_.WaitForNotificationWithTimeout(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

}  // namespace tutti::stager
