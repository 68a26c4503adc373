// The wire form (tutti.v1.Exchange, plan.proto) of a dispatch plan's
// exchange lists, for tools that run a DispatchPlan's all-to-all over a real
// transport (`tutti bench exchange --transport mpi`). The plans tutti-packerd
// serves are built by the packer (services/packer/plan_proto.h) from the
// placement alone.
#ifndef TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_MOVE_LISTS_PROTO_H_
#define TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_MOVE_LISTS_PROTO_H_

#include "services/packer/core/post_balancing/dispatch_types.h"
#include "tutti/v1/plan.pb.h"

namespace tutti::dispatch {

// One rank's side of an exchange (forward or load): transfers in the same
// order, items named by sample id, encoder (ENCODER_UNSPECIFIED for token
// ids) and index, byte totals. *out is cleared first.
void FillExchange(const DispatchInput& input, const RankExchange& exchange, v1::Exchange* out);

v1::Encoder ToProtoEncoder(EncoderKind kind);

}  // namespace tutti::dispatch

#endif  // TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_MOVE_LISTS_PROTO_H_
