// The gRPC face of tutti-packerd (tutti.v1.Packer, callback API over raw
// request bytes): the gate (common/rpc_gate.h) bounds, parses and
// authenticates each request; the handler checks its repeated fields and,
// for reports by a rank, that the caller is that rank (rank_identity.h),
// then calls the Packer logic class and turns absl::Status into
// grpc::Status, nothing else.
#ifndef TUTTI_SERVICES_PACKER_PACKER_SERVICE_H_
#define TUTTI_SERVICES_PACKER_PACKER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/rank_identity.h"
#include "common/rpc_gate.h"
#include "services/packer/locality_monitor.h"
#include "services/packer/packer.h"
#include "tutti/v1/packer.grpc.pb.h"

namespace tutti::packer {

// Most phases one timing report may carry.
inline constexpr int kMaxReportPhases = 32;
// StreamPlans open at once on one client connection (--max_streams_per_client):
// a stager holds one, a reconnecting one briefly two.
inline constexpr uint32_t kDefaultMaxStreamsPerClient = 64;

// The kept bytes of a plan as an answer, without copying them: one slice
// over the bytes that holds a reference to them until gRPC has sent them
// (and every copy of the buffer is gone).
grpc::ByteBuffer AsByteBuffer(Packer::PlanBytes bytes);

using RawPackerService = v1::Packer::WithRawCallbackMethod_GetJob<
    v1::Packer::WithRawCallbackMethod_GetPlan<v1::Packer::WithRawCallbackMethod_StreamPlans<
        v1::Packer::WithRawCallbackMethod_ReportTiming<
            v1::Packer::WithRawCallbackMethod_ReportNode<v1::Packer::Service>>>>>;

class PackerService final : public RawPackerService {
 public:
  // All must outlive the service. A client connection (its peer address)
  // may hold max_streams_per_client StreamPlans at once; one more is
  // RESOURCE_EXHAUSTED, counted as refused "too_many_streams".
  // `monitor` (may be null: ReportNode is FAILED_PRECONDITION) takes the
  // stagers' node reports.
  PackerService(Packer* packer, RpcGate* gate, RankIdentities* ranks,
                uint32_t max_streams_per_client = kDefaultMaxStreamsPerClient,
                LocalityMonitor* monitor = nullptr)
      : packer_(packer),
        gate_(gate),
        ranks_(ranks),
        monitor_(monitor),
        max_streams_per_client_(max_streams_per_client) {}

  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                   grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* GetPlan(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                    grpc::ByteBuffer* out) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* StreamPlans(grpc::CallbackServerContext* ctx,
                                                          const grpc::ByteBuffer* in) override;
  grpc::ServerUnaryReactor* ReportTiming(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* in,
                                         grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* ReportNode(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                       grpc::ByteBuffer* out) override;

  // Client connections holding a plan stream now (0 once every stream ended).
  size_t clients_with_streams() const {
    absl::MutexLock l(&streams_mu_);
    return streams_.size();
  }

 private:
  // INVALID_ARGUMENT (counted) when a request names more ranks than the job has.
  absl::Status CheckRankList(int ranks);
  // Counts a stream of client `peer` while the ticket lives; the refusal
  // (counted) when the client already holds max_streams_per_client_.
  absl::StatusOr<CallTicket> AdmitStream(const std::string& peer);

  Packer* packer_;
  RpcGate* gate_;
  RankIdentities* ranks_;
  LocalityMonitor* monitor_;
  const uint32_t max_streams_per_client_;
  mutable absl::Mutex streams_mu_;
  // Open plan streams per client connection; entries at 0 are erased.
  absl::flat_hash_map<std::string, uint32_t> streams_ ABSL_GUARDED_BY(streams_mu_);
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_PACKER_SERVICE_H_
