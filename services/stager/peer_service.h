// tutti.v1.Stager as served on --peer_listen: the address other nodes'
// stagers reach over TCP when --listen is a Unix socket for the node's own
// ranks. It serves FetchMembers only (the same handler as --listen, behind
// the same gate: the job's token and TLS, the request's bounds); every
// rank's call (RegisterRank, AcquireBatch, ...) is refused PERMISSION_DENIED
// naming the address a rank must use, counted in
// tutti_rpc_refused_total{reason="peer_listener"}. A method added to the
// service later and not named here answers UNIMPLEMENTED on this address.
//
// Thread-safe as StagerService is.
#ifndef TUTTI_SERVICES_STAGER_PEER_SERVICE_H_
#define TUTTI_SERVICES_STAGER_PEER_SERVICE_H_

#include "common/rpc_gate.h"
#include "services/stager/stager_service.h"

namespace tutti::stager {

class PeerStagerService final : public RawStagerService {
 public:
  // Both must outlive the service.
  PeerStagerService(StagerService* service, RpcGate* gate) : service_(service), gate_(gate) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* FetchMembers(grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* in) override {
    return service_->FetchMembers(ctx, in);
  }

  grpc::ServerUnaryReactor* GetStageStatus(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer*, grpc::ByteBuffer*) override {
    return Refuse(ctx, "GetStageStatus");
  }
  grpc::ServerUnaryReactor* RegisterRank(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer*,
                                         grpc::ByteBuffer*) override {
    return Refuse(ctx, "RegisterRank");
  }
  grpc::ServerUnaryReactor* AcquireBatch(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer*,
                                         grpc::ByteBuffer*) override {
    return Refuse(ctx, "AcquireBatch");
  }
  grpc::ServerUnaryReactor* ReleaseBatch(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer*,
                                         grpc::ByteBuffer*) override {
    return Refuse(ctx, "ReleaseBatch");
  }
  grpc::ServerUnaryReactor* RenewLeases(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer*,
                                        grpc::ByteBuffer*) override {
    return Refuse(ctx, "RenewLeases");
  }

 private:
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx, const char* method);

  StagerService* const service_;
  RpcGate* const gate_;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_PEER_SERVICE_H_
