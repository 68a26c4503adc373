// The gRPC face of tutti-packerd (tutti.v1.Packer, callback API): turns
// requests into calls on the Packer logic class and absl::Status into
// grpc::Status, nothing else.
#ifndef TUTTI_SERVICES_PACKER_PACKER_SERVICE_H_
#define TUTTI_SERVICES_PACKER_PACKER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "services/packer/packer.h"
#include "tutti/v1/packer.grpc.pb.h"

namespace tutti::packer {

class PackerService final : public v1::Packer::CallbackService {
 public:
  explicit PackerService(Packer* packer) : packer_(packer) {}

  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                   v1::JobInfo* resp) override;
  grpc::ServerUnaryReactor* GetPlan(grpc::CallbackServerContext* ctx, const v1::GetPlanRequest* req,
                                    v1::StepPlan* resp) override;
  grpc::ServerWriteReactor<v1::StepPlan>* StreamPlans(grpc::CallbackServerContext* ctx,
                                                      const v1::StreamPlansRequest* req) override;
  grpc::ServerUnaryReactor* ReportTiming(grpc::CallbackServerContext* ctx,
                                         const v1::StepTimingReport* req,
                                         v1::ReportTimingResponse* resp) override;

 private:
  Packer* packer_;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_PACKER_SERVICE_H_
