// The tutti.v1 wire types the client API names, declared without their
// generated headers, so that including the client pulls in neither protobuf
// nor gRPC. To read a message's fields, include its generated header
// (installed with the client): "tutti/v1/plan.pb.h" (RankPlan, SampleInfo),
// "tutti/v1/stager.pb.h" (BatchDescriptor, SkippedSample),
// "tutti/v1/packer.pb.h" (JobInfo), "tutti/v1/common.pb.h" (DType, Encoder).
#ifndef TUTTI_CLIENT_PROTO_FWD_H_
#define TUTTI_CLIENT_PROTO_FWD_H_

namespace google::protobuf {
template <typename Element>
class RepeatedPtrField;
}  // namespace google::protobuf

namespace tutti::v1 {
enum DType : int;
enum Encoder : int;
class BatchDescriptor;
class JobInfo;
class RankPlan;
class SampleInfo;
class SkippedSample;
}  // namespace tutti::v1

#endif  // TUTTI_CLIENT_PROTO_FWD_H_
