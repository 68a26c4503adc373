#include "services/stager/stager_service.h"

#include "common/grpc_status.h"

namespace tutti::stager {

grpc::ServerUnaryReactor* StagerService::GetStageStatus(grpc::CallbackServerContext* ctx,
                                                        const v1::GetStageStatusRequest*,
                                                        v1::StageStatus* resp) {
  *resp = core_->GetStageStatus();
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* StagerService::AcquireBatch(grpc::CallbackServerContext* ctx,
                                                      const v1::AcquireBatchRequest* req,
                                                      v1::BatchDescriptor* resp) {
  auto* reactor = ctx->DefaultReactor();
  core_->AcquireAsync(req->step(), req->rank(), req->timeout_ms(),
                      [reactor, resp](absl::StatusOr<v1::BatchDescriptor> r) {
                        if (r.ok()) *resp = std::move(*r);
                        reactor->Finish(ToGrpcStatus(r.status()));
                      });
  return reactor;
}

grpc::ServerUnaryReactor* StagerService::ReleaseBatch(grpc::CallbackServerContext* ctx,
                                                      const v1::ReleaseBatchRequest* req,
                                                      v1::ReleaseBatchResponse*) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(core_->Release(
      req->step(), req->rank(),
      req->has_wait_seconds() ? std::optional<double>(req->wait_seconds()) : std::nullopt)));
  return reactor;
}

}  // namespace tutti::stager
