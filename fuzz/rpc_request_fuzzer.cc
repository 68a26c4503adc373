// Every request of tutti.v1.Packer and tutti.v1.Stager as a daemon's gate
// takes it off the wire (common/rpc_gate.h): the first byte picks the method,
// the rest are the request's bytes. Whatever the gate admits must parse to a
// message that serializes and parses back to the same message; whatever it
// refuses must be refused with INVALID_ARGUMENT or RESOURCE_EXHAUSTED.
#include <google/protobuf/util/field_comparator.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/rpc_gate.h"
#include "tutti/v1/packer.pb.h"
#include "tutti/v1/stager.pb.h"

namespace {

std::unique_ptr<google::protobuf::Message> RequestOf(uint8_t method) {
  switch (method % 11) {
    case 0:
      return std::make_unique<tutti::v1::GetJobRequest>();
    case 1:
      return std::make_unique<tutti::v1::GetPlanRequest>();
    case 2:
      return std::make_unique<tutti::v1::StreamPlansRequest>();
    case 3:
      return std::make_unique<tutti::v1::StepTimingReport>();
    case 4:
      return std::make_unique<tutti::v1::GetStageStatusRequest>();
    case 5:
      return std::make_unique<tutti::v1::AcquireBatchRequest>();
    case 6:
      return std::make_unique<tutti::v1::ReleaseBatchRequest>();
    case 7:
      return std::make_unique<tutti::v1::RenewLeasesRequest>();
    case 8:
      return std::make_unique<tutti::v1::NodeReport>();
    case 9:
      return std::make_unique<tutti::v1::FetchMembersRequest>();
    default:
      return std::make_unique<tutti::v1::RegisterRankRequest>();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static tutti::RpcGate* gate = [] {
    tutti::RpcGateOptions o;
    o.max_request_bytes = 4096;
    return new tutti::RpcGate(o, "fuzz", nullptr);  // lives as long as the process
  }();
  std::unique_ptr<google::protobuf::Message> request = RequestOf(data[0]);
  grpc::Slice slice(data + 1, size - 1);
  grpc::ByteBuffer bytes(&slice, 1);
  grpc::CallbackServerContext ctx;
  absl::StatusOr<tutti::CallTicket> ticket = gate->Admit(ctx, bytes, request.get());
  if (!ticket.ok()) {
    const absl::StatusCode code = ticket.status().code();
    if (code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kResourceExhausted) {
      std::abort();
    }
    return 0;
  }
  std::unique_ptr<google::protobuf::Message> again = RequestOf(data[0]);
  // A NaN (ReleaseBatchRequest.wait_seconds) survives the round trip but is
  // never equal to itself.
  google::protobuf::util::DefaultFieldComparator nan_equal;
  nan_equal.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differ;
  differ.set_field_comparator(&nan_equal);
  if (!again->ParseFromString(request->SerializeAsString()) || !differ.Compare(*request, *again)) {
    std::abort();
  }
  return 0;
}
