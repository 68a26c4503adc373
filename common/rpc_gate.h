// The door of every tutti RPC handler. Handlers take their requests as raw
// bytes, and the gate, before any logic runs: bounds the request's size,
// parses it (bytes that are not the method's message are INVALID_ARGUMENT
// naming it, not gRPC's own empty UNIMPLEMENTED), and checks the job token
// and client certificate (CallAuthenticator). Every refusal, there or by the
// handler's own checks (identity, repeated fields, state), is counted in
// tutti_rpc_refused_total{service, reason}.
//
//   grpc::ServerUnaryReactor* GetPlan(grpc::CallbackServerContext* ctx,
//                                     const grpc::ByteBuffer* in, grpc::ByteBuffer* out) override {
//     return ServeUnary<v1::GetPlanRequest, v1::StepPlan>(&gate_, ctx, in, out,
//         [this](const v1::GetPlanRequest& req, v1::StepPlan* resp, auto done) { ... done(s); });
//   }
//
// Thread-safety: Admit and Refuse may be called from any thread.
#ifndef TUTTI_COMMON_RPC_GATE_H_
#define TUTTI_COMMON_RPC_GATE_H_

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/grpc_status.h"
#include "common/rpc_security.h"

namespace tutti {

struct RpcGateOptions {
  // A request larger than this is RESOURCE_EXHAUSTED naming both sizes.
  // Default 64 KiB: tutti's largest request, a GetPlan naming every rank of
  // a 2,560-rank job, is about 10 KB.
  uint64_t max_request_bytes = 64 << 10;
  // Calls in flight at once, over all clients; one more is
  // RESOURCE_EXHAUSTED. Default 16,384: every rank of a 2,560-rank job and
  // every stager may hold a few.
  uint32_t max_calls = 16384;
  // The token and client-certificate name every call must carry.
  SecurityOptions security;
};

class RpcGate;

// The gRPC server options a daemon serving `listen` behind `gate` needs: its
// credentials (see MakeServerCredentials; `warn` hears why an address is
// unsafe), a receive limit above the gate's, so that the gate answers an
// oversized request with its own message, and, on a Unix socket, a count of
// the connections refused by their peer's credentials (reason
// "peer_credentials"). Fields of `out` not named here
// are kept. `gate` must outlive the server.
absl::Status ApplyRpcGateOptions(RpcGate* gate, const std::string& listen,
                                 const std::function<void(const std::string&)>& warn,
                                 GrpcServerOptions* out);

// Holds one of the gate's in-flight calls until destroyed.
using CallTicket = std::shared_ptr<void>;

class RpcGate {
 public:
  // `service` labels the metric ("tutti.v1.Packer"); registry may be null.
  RpcGate(const RpcGateOptions& options, std::string service, prometheus::Registry* registry);

  // Checks the call and parses `bytes` into *request; the ticket counts
  // the call as in flight until the caller drops it. The status to finish
  // the call with when it is not OK.
  absl::StatusOr<CallTicket> Admit(const grpc::CallbackServerContext& ctx,
                                   const grpc::ByteBuffer& bytes,
                                   google::protobuf::Message* request);
  // Counts a refusal the handler decided (reason: a short snake_case word)
  // and returns `status` for it to finish the call with.
  absl::Status Refuse(absl::string_view reason, absl::Status status);

  const RpcGateOptions& options() const { return options_; }
  const CallAuthenticator& authenticator() const { return auth_; }

 private:
  prometheus::Counter* Counter(absl::string_view reason);

  const RpcGateOptions options_;
  const std::string service_;
  const CallAuthenticator auth_;
  std::shared_ptr<std::atomic<uint32_t>> in_flight_ = std::make_shared<std::atomic<uint32_t>>(0);
  prometheus::Family<prometheus::Counter>* refused_ = nullptr;
  prometheus::Gauge* in_flight_gauge_ = nullptr;
  prometheus::Counter* too_many_calls_ = nullptr;
  prometheus::Counter* too_large_ = nullptr;
  prometheus::Counter* unparseable_ = nullptr;
  prometheus::Counter* unauthenticated_ = nullptr;
};

// A protobuf message as the bytes of a response.
absl::Status SerializeTo(const google::protobuf::Message& message, grpc::ByteBuffer* out);

// A unary method over raw bytes: the gate admits and parses the request,
// `handle` fills the typed response and calls `done` (on any thread), the
// response is serialized and the call finished.
template <typename Request, typename Response>
grpc::ServerUnaryReactor* ServeUnary(
    RpcGate* gate, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out,
    const std::function<void(const Request&, Response*, std::function<void(absl::Status)>)>&
        handle) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  struct Call {
    Request request;
    Response response;
  };
  auto call = std::make_shared<Call>();
  absl::StatusOr<CallTicket> ticket = gate->Admit(*ctx, *in, &call->request);
  if (!ticket.ok()) {
    reactor->Finish(ToGrpcStatus(ticket.status()));
    return reactor;
  }
  handle(call->request, &call->response,
         [call, reactor, out, ticket = *std::move(ticket)](absl::Status s) {
           if (s.ok()) s = SerializeTo(call->response, out);
           reactor->Finish(ToGrpcStatus(s));
         });
  return reactor;
}

// A server-streaming method whose request the gate refused: finishes at once.
class RefusedStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RefusedStream(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
  void OnDone() override { delete this; }
};

}  // namespace tutti

#endif  // TUTTI_COMMON_RPC_GATE_H_
