#include "common/rpc_gate.h"

#include <algorithm>

#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tutti {

absl::Status ApplyRpcGateOptions(RpcGate* gate, const std::string& listen,
                                 const std::function<void(const std::string&)>& warn,
                                 GrpcServerOptions* out) {
  const RpcGateOptions& rpc = gate->options();
  out->on_peer_refused = [gate](const absl::Status& why) {
    (void)gate->Refuse("peer_credentials", why);
  };
  out->max_receive_bytes = static_cast<int>(
      std::max<uint64_t>(out->max_receive_bytes, 2 * rpc.max_request_bytes));
  ASSIGN_OR_RETURN(out->credentials, MakeServerCredentials(rpc.security, listen, warn));
  return absl::OkStatus();
}

RpcGate::RpcGate(const RpcGateOptions& options, std::string service, prometheus::Registry* registry)
    : options_(options), service_(std::move(service)), auth_(options.security) {
  if (registry != nullptr) {
    refused_ = &prometheus::BuildCounter()
                    .Name("tutti_rpc_refused_total")
                    .Help(
                        "Calls refused before or by their handler, by reason (too_large, "
                        "unparseable, unauthenticated, too_many_calls, permission_denied, "
                        "too_many_items, peer_credentials, ...)")
                    .Register(*registry);
    too_large_ = Counter("too_large");
    too_many_calls_ = Counter("too_many_calls");
    in_flight_gauge_ = &prometheus::BuildGauge()
                            .Name("tutti_rpc_calls_in_flight")
                            .Help("Calls admitted and not yet finished")
                            .Register(*registry)
                            .Add({{"service", service_}});
    unparseable_ = Counter("unparseable");
    unauthenticated_ = Counter("unauthenticated");
  }
}

prometheus::Counter* RpcGate::Counter(absl::string_view reason) {
  if (refused_ == nullptr) return nullptr;
  return &refused_->Add({{"service", service_}, {"reason", std::string(reason)}});
}

absl::Status RpcGate::Refuse(absl::string_view reason, absl::Status status) {
  if (prometheus::Counter* c = Counter(reason)) c->Increment();
  return status;
}

absl::StatusOr<CallTicket> RpcGate::Admit(const grpc::CallbackServerContext& ctx,
                                          const grpc::ByteBuffer& bytes,
                                          google::protobuf::Message* request) {
  if (absl::Status s = auth_.Check(ctx); !s.ok()) {
    if (unauthenticated_) unauthenticated_->Increment();
    return s;
  }
  const size_t size = bytes.Length();
  if (size > options_.max_request_bytes) {
    if (too_large_) too_large_->Increment();
    return absl::ResourceExhaustedError(
        absl::StrCat("the ", request->GetTypeName(), " is ", size, " bytes, over the limit of ",
                     options_.max_request_bytes, " (--max_request_bytes)"));
  }
  grpc::ByteBuffer copy(bytes);  // the reader consumes its buffer
  bool parsed = false;
  {
    grpc::ProtoBufferReader reader(&copy);
    parsed = reader.status().ok() && request->ParseFromZeroCopyStream(&reader);
  }
  if (!parsed) {
    if (unparseable_) unparseable_->Increment();
    return absl::InvalidArgumentError(
        absl::StrCat("the request (", size, " bytes) is not a valid ", request->GetTypeName()));
  }
  const uint32_t now = in_flight_->fetch_add(1) + 1;
  CallTicket ticket(nullptr, [counter = in_flight_, gauge = in_flight_gauge_](void*) {
    counter->fetch_sub(1);
    if (gauge) gauge->Decrement();
  });
  if (in_flight_gauge_) in_flight_gauge_->Increment();
  if (now > options_.max_calls) {
    if (too_many_calls_) too_many_calls_->Increment();
    return absl::ResourceExhaustedError(
        absl::StrCat("the daemon already serves ", options_.max_calls,
                     " calls, its limit (--max_calls); retry later"));
  }
  return ticket;
}

absl::Status SerializeTo(const google::protobuf::Message& message, grpc::ByteBuffer* out) {
  const size_t size = message.ByteSizeLong();
  if (size > static_cast<size_t>(INT32_MAX)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a ", message.GetTypeName(), " of ", size, " bytes is too large to send"));
  }
  grpc::ProtoBufferWriter writer(out, grpc::kProtoBufferWriterMaxBufferLength,
                                 static_cast<int>(size));
  if (!message.SerializeToZeroCopyStream(&writer)) {
    return absl::InternalError(absl::StrCat("cannot serialize a ", message.GetTypeName()));
  }
  return absl::OkStatus();
}

}  // namespace tutti
