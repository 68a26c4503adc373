// gRPC handler for tutti.v1.Stager (callback API over raw request bytes):
// the gate (common/rpc_gate.h) bounds, parses and authenticates each
// request; a call for a rank's batch must come from that rank
// (rank_identity.h) and name the rank's registered process
// (rank_processes.h); then it translates proto <-> StagerCore calls and
// absl::Status <-> grpc::Status, nothing else. AcquireBatch completes when
// the core answers (no gRPC thread blocks while waiting).
#ifndef TUTTI_SERVICES_STAGER_STAGER_SERVICE_H_
#define TUTTI_SERVICES_STAGER_STAGER_SERVICE_H_

#include <memory>

#include "common/rank_identity.h"
#include "common/rpc_gate.h"
#include "services/stager/stager_core.h"
#include "tutti/v1/stager.grpc.pb.h"

namespace tutti::stager {

using RawStagerService = v1::Stager::WithRawCallbackMethod_GetStageStatus<
    v1::Stager::WithRawCallbackMethod_RegisterRank<v1::Stager::WithRawCallbackMethod_AcquireBatch<
        v1::Stager::WithRawCallbackMethod_ReleaseBatch<
            v1::Stager::WithRawCallbackMethod_RenewLeases<
                v1::Stager::WithRawCallbackMethod_FetchMembers<v1::Stager::Service>>>>>>;

class StagerService final : public RawStagerService {
 public:
  // All must outlive the service.
  // metrics: for FetchMembers' counts (may be null).
  StagerService(StagerCore* core, RpcGate* gate, RankIdentities* ranks,
                std::shared_ptr<StagerMetrics> metrics = nullptr)
      : core_(core), gate_(gate), ranks_(ranks), metrics_(std::move(metrics)) {}

  grpc::ServerUnaryReactor* GetStageStatus(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* in,
                                           grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* RegisterRank(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* in,
                                         grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* AcquireBatch(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* in,
                                         grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* ReleaseBatch(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* in,
                                         grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* RenewLeases(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* in, grpc::ByteBuffer* out) override;
  // Another node's stager asks for member bytes (member_stream.h): the
  // job's token (the gate), the request's bounds, then the reads. It acts as
  // no rank.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* FetchMembers(grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* in) override;

 private:
  // OK when the caller may act as `rank`; else the refusal (counted).
  // named: the call must say which rank it acts as (tutti-rank), token or not.
  absl::Status AdmitRank(const grpc::CallbackServerContext& ctx, uint32_t rank, bool named = false);
  // AdmitRank, then OK when the call's incarnation and key may act for
  // `rank` (StagerCore::CheckCaller); else the refusal (counted, reason
  // "incarnation").
  absl::Status AdmitProcess(const grpc::CallbackServerContext& ctx, uint32_t rank,
                            uint64_t incarnation, const std::string& key);

  StagerCore* core_;
  RpcGate* gate_;
  RankIdentities* ranks_;
  std::shared_ptr<StagerMetrics> metrics_;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_STAGER_SERVICE_H_
