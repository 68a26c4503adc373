#include "services/stager/stager_service.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "services/stager/member_stream.h"

namespace tutti::stager {
namespace {

// Steps one RenewLeasesRequest may name.
constexpr int kMaxRenewedSteps = 1024;

}  // namespace

absl::Status StagerService::AdmitRank(const grpc::CallbackServerContext& ctx, uint32_t rank,
                                      bool named) {
  absl::StatusOr<ClientIdentity> caller = CallIdentity(ctx);
  absl::Status s = caller.ok() ? ranks_->Admit(*caller, rank) : caller.status();
  if (s.ok() && named && caller->rank < 0) {
    s = absl::PermissionDeniedError(absl::StrCat(
        "rank ", rank, ": a process registers only as the rank it says it is (", kRankKey,
        " metadata); ranks connect through libtutti (tutti::Client), which sends it"));
  }
  if (s.ok() || absl::IsUnavailable(s)) return s;
  return gate_->Refuse("permission_denied", s);
}

absl::Status StagerService::AdmitProcess(const grpc::CallbackServerContext& ctx, uint32_t rank,
                                         uint64_t incarnation, const std::string& key) {
  RETURN_IF_ERROR(AdmitRank(ctx, rank));
  absl::Status s = core_->CheckCaller(rank, ProcessKey{incarnation, key});
  return s.ok() ? s : gate_->Refuse("incarnation", s);
}

grpc::ServerUnaryReactor* StagerService::RegisterRank(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* in,
                                                      grpc::ByteBuffer* out) {
  return ServeUnary<v1::RegisterRankRequest, v1::RegisterRankResponse>(
      gate_, ctx, in, out,
      [this, ctx](const v1::RegisterRankRequest& req, v1::RegisterRankResponse* resp, auto done) {
        if (absl::Status s = AdmitRank(*ctx, req.rank(), /*named=*/true); !s.ok()) return done(s);
        absl::StatusOr<ProcessKey> issued = core_->RegisterRank(req.rank());
        if (!issued.ok()) return done(issued.status());
        resp->set_incarnation(issued->incarnation);
        resp->set_key(issued->key);
        resp->set_lease_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(core_->lease())));
        done(absl::OkStatus());
      });
}

grpc::ServerUnaryReactor* StagerService::GetStageStatus(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* in,
                                                        grpc::ByteBuffer* out) {
  return ServeUnary<v1::GetStageStatusRequest, v1::StageStatus>(
      gate_, ctx, in, out,
      [this](const v1::GetStageStatusRequest&, v1::StageStatus* resp, auto done) {
        if (!core_->Started()) {
          return done(absl::UnavailableError(
              "tutti-stagerd is starting: it has no job from its packer yet; retry"));
        }
        *resp = core_->GetStageStatus();
        done(absl::OkStatus());
      });
}

grpc::ServerUnaryReactor* StagerService::AcquireBatch(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* in,
                                                      grpc::ByteBuffer* out) {
  return ServeUnary<v1::AcquireBatchRequest, v1::BatchDescriptor>(
      gate_, ctx, in, out,
      [this, ctx](const v1::AcquireBatchRequest& req, v1::BatchDescriptor* resp, auto done) {
        if (absl::Status s = AdmitProcess(*ctx, req.rank(), req.incarnation(), req.key());
            !s.ok()) {
          return done(s);
        }
        if (absl::Status s = core_->CheckAcquireTimeout(req.timeout_ms()); !s.ok()) {
          return done(gate_->Refuse("timeout_too_long", s));
        }
        core_->AcquireAsync(
            req.step(), req.rank(), req.timeout_ms(),
            [resp, done](absl::StatusOr<v1::BatchDescriptor> r) {
              if (r.ok()) *resp = *std::move(r);
              done(r.status());
            },
            ProcessKey{req.incarnation(), req.key()}, req.renews_leases());
      });
}

grpc::ServerUnaryReactor* StagerService::ReleaseBatch(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* in,
                                                      grpc::ByteBuffer* out) {
  return ServeUnary<v1::ReleaseBatchRequest, v1::ReleaseBatchResponse>(
      gate_, ctx, in, out,
      [this, ctx](const v1::ReleaseBatchRequest& req, v1::ReleaseBatchResponse*, auto done) {
        if (absl::Status s = AdmitProcess(*ctx, req.rank(), req.incarnation(), req.key());
            !s.ok()) {
          return done(s);
        }
        absl::Status s = core_->Release(
            req.step(), req.rank(), ProcessKey{req.incarnation(), req.key()},
            req.has_wait_seconds() ? std::optional<double>(req.wait_seconds()) : std::nullopt);
        if (s.ok()) return done(s);
        done(gate_->Refuse(absl::IsInvalidArgument(s) ? "invalid" : "release_refused", s));
      });
}

grpc::ServerUnaryReactor* StagerService::RenewLeases(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* in,
                                                     grpc::ByteBuffer* out) {
  return ServeUnary<v1::RenewLeasesRequest, v1::RenewLeasesResponse>(
      gate_, ctx, in, out,
      [this, ctx](const v1::RenewLeasesRequest& req, v1::RenewLeasesResponse* resp, auto done) {
        if (req.incarnation() == 0) {
          return done(gate_->Refuse("invalid", absl::InvalidArgumentError(absl::StrCat(
                                                   "a lease renewal of rank ", req.rank(),
                                                   " must name its process (incarnation 0)"))));
        }
        if (absl::Status s = AdmitProcess(*ctx, req.rank(), req.incarnation(), req.key());
            !s.ok()) {
          return done(s);
        }
        if (req.steps_size() > kMaxRenewedSteps) {
          return done(gate_->Refuse(
              "too_many_items",
              absl::InvalidArgumentError(absl::StrCat("RenewLeasesRequest names ", req.steps_size(),
                                                      " steps; at most ", kMaxRenewedSteps,
                                                      " (a rank holds a few batches at a time)"))));
        }
        absl::StatusOr<std::vector<uint64_t>> lost =
            core_->RenewLeases(req.rank(), ProcessKey{req.incarnation(), req.key()},
                               {req.steps().begin(), req.steps().end()});
        if (!lost.ok()) {
          return done(absl::IsUnavailable(lost.status())
                          ? lost.status()
                          : gate_->Refuse("renewal_refused", lost.status()));
        }
        resp->set_lease_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(core_->lease())));
        for (uint64_t step : *lost) resp->add_lost(step);
        done(absl::OkStatus());
      });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* StagerService::FetchMembers(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in) {
  v1::FetchMembersRequest req;
  absl::StatusOr<CallTicket> ticket = gate_->Admit(*ctx, *in, &req);
  if (!ticket.ok()) return new RefusedStream(ticket.status());
  if (absl::Status s = CheckFetchRequest(req); !s.ok()) {
    return new RefusedStream(
        gate_->Refuse(absl::IsResourceExhausted(s) ? "too_large" : "too_many_items", s));
  }
  if (!core_->Started()) {
    ctx->AddTrailingMetadata(kPeerStartingKey, "1");
    return new RefusedStream(absl::UnavailableError(
        "tutti-stagerd is starting: it has no job from its packer yet; read the source"));
  }
  // Within the caller's deadline and never past this stager's sample deadline.
  absl::Time deadline = absl::Now() + core_->sample_deadline();
  const absl::Time asked = absl::FromChrono(ctx->deadline());
  if (asked < deadline) deadline = asked;
  if (metrics_) metrics_->peer_served_calls.Increment();
  return new MemberStream(core_, metrics_, std::move(req), deadline, *std::move(ticket));
}

}  // namespace tutti::stager
