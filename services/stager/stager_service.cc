#include "services/stager/stager_service.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace tutti::stager {
namespace {

// Steps one RenewLeasesRequest may name.
constexpr int kMaxRenewedSteps = 1024;

}  // namespace

absl::Status StagerService::AdmitRank(const grpc::CallbackServerContext& ctx, uint32_t rank) {
  absl::StatusOr<ClientIdentity> caller = CallIdentity(ctx);
  absl::Status s = caller.ok() ? ranks_->Admit(*caller, rank) : caller.status();
  if (s.ok() || absl::IsUnavailable(s)) return s;
  return gate_->Refuse("permission_denied", s);
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
        if (absl::Status s = AdmitRank(*ctx, req.rank()); !s.ok()) return done(s);
        if (absl::Status s = core_->CheckAcquireTimeout(req.timeout_ms()); !s.ok()) {
          return done(gate_->Refuse("timeout_too_long", s));
        }
        core_->AcquireAsync(
            req.step(), req.rank(), req.timeout_ms(),
            [resp, done](absl::StatusOr<v1::BatchDescriptor> r) {
              if (r.ok()) *resp = *std::move(r);
              done(r.status());
            },
            req.incarnation(), req.renews_leases());
      });
}

grpc::ServerUnaryReactor* StagerService::ReleaseBatch(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* in,
                                                      grpc::ByteBuffer* out) {
  return ServeUnary<v1::ReleaseBatchRequest, v1::ReleaseBatchResponse>(
      gate_, ctx, in, out,
      [this, ctx](const v1::ReleaseBatchRequest& req, v1::ReleaseBatchResponse*, auto done) {
        if (absl::Status s = AdmitRank(*ctx, req.rank()); !s.ok()) return done(s);
        absl::Status s = core_->Release(
            req.step(), req.rank(), req.incarnation(),
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
        if (absl::Status s = AdmitRank(*ctx, req.rank()); !s.ok()) return done(s);
        if (req.steps_size() > kMaxRenewedSteps) {
          return done(gate_->Refuse(
              "too_many_items",
              absl::InvalidArgumentError(absl::StrCat("RenewLeasesRequest names ", req.steps_size(),
                                                      " steps; at most ", kMaxRenewedSteps,
                                                      " (a rank holds a few batches at a time)"))));
        }
        absl::StatusOr<std::vector<uint64_t>> lost = core_->RenewLeases(
            req.rank(), req.incarnation(), {req.steps().begin(), req.steps().end()});
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

}  // namespace tutti::stager
