// gRPC handler for tutti.v1.Stager: translates proto <-> StagerCore calls and
// absl::Status <-> grpc::Status, nothing else. Callback API; AcquireBatch
// completes when the core answers (no gRPC thread blocks while waiting).
#ifndef TUTTI_SERVICES_STAGER_STAGER_SERVICE_H_
#define TUTTI_SERVICES_STAGER_STAGER_SERVICE_H_

#include "services/stager/stager_core.h"
#include "tutti/v1/stager.grpc.pb.h"

namespace tutti::stager {

class StagerService final : public v1::Stager::CallbackService {
 public:
  explicit StagerService(StagerCore* core) : core_(core) {}

  grpc::ServerUnaryReactor* GetStageStatus(grpc::CallbackServerContext* ctx,
                                           const v1::GetStageStatusRequest* req,
                                           v1::StageStatus* resp) override;
  grpc::ServerUnaryReactor* AcquireBatch(grpc::CallbackServerContext* ctx,
                                         const v1::AcquireBatchRequest* req,
                                         v1::BatchDescriptor* resp) override;
  grpc::ServerUnaryReactor* ReleaseBatch(grpc::CallbackServerContext* ctx,
                                         const v1::ReleaseBatchRequest* req,
                                         v1::ReleaseBatchResponse* resp) override;

 private:
  StagerCore* core_;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_STAGER_SERVICE_H_
