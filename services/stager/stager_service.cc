#include "services/stager/stager_service.h"

#include <thread>

#include "common/grpc_status.h"

namespace tutti::stager {

grpc::ServerUnaryReactor* StagerService::Stage(grpc::CallbackServerContext* ctx,
                                               const v1::StageRequest* req, v1::StageResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (!req->wait()) {
    *resp = core_->Stage(*req);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  // Waiting for copies can take minutes: do it off the gRPC threads.
  std::thread([this, req, resp, reactor] {
    *resp = core_->Stage(*req);
    reactor->Finish(grpc::Status::OK);
  }).detach();
  return reactor;
}

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
  reactor->Finish(ToGrpcStatus(core_->Release(req->step(), req->rank())));
  return reactor;
}

}  // namespace tutti::stager
