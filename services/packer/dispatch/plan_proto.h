// Conversion of a dispatch plan into the wire types of tutti.v1 (plan.proto):
// per rank, the encoder phases, LLM micro-batches and the exchange lists of
// a RankPlan; for the step, the phase statistics of PlanStats. The planner
// fills the rest of StepPlan (samples, shards, identity).
#ifndef TUTTI_SERVICES_PACKER_DISPATCH_PLAN_PROTO_H_
#define TUTTI_SERVICES_PACKER_DISPATCH_PLAN_PROTO_H_

#include <cstdint>

#include "absl/status/status.h"
#include "services/packer/dispatch/dispatch_types.h"
#include "tutti/v1/plan.pb.h"

namespace tutti::dispatch {

struct PlanProtoOptions {
  // Chunked ViT forward: at most this many patches per EncoderChunk (an image
  // larger than that is alone in its chunk). Default 65536, as
  // BatchConfig.max_patches_per_chunk.
  uint64_t max_patches_per_chunk = 65536;
};

// Fills rank `rank` of `plan` into *out (cleared first): rank, node,
// micro_batches (text first), encoders (one EncoderPhase per encoder that has
// items in the step, with chunks for vision), exchange, load_exchange, cost
// and drawn. INVALID_ARGUMENT for a rank outside the plan.
absl::Status FillRankPlan(const DispatchInput& input, const DispatchOptions& options,
                          const DispatchPlan& plan, uint32_t rank, const PlanProtoOptions& proto,
                          v1::RankPlan* out);

// Phase statistics and byte totals (plan_seconds is left to the caller).
void FillPlanStats(const DispatchPlan& plan, v1::PlanStats* out);

v1::Encoder ToProtoEncoder(EncoderKind kind);

}  // namespace tutti::dispatch

#endif  // TUTTI_SERVICES_PACKER_DISPATCH_PLAN_PROTO_H_
