// Planning-core results as wire messages (tutti.v1.StepPlan, JobInfo), and
// the identity hash of a plan.
#ifndef TUTTI_SERVICES_PACKER_PLAN_PROTO_H_
#define TUTTI_SERVICES_PACKER_PLAN_PROTO_H_

#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "services/packer/core/job.h"
#include "services/packer/core/plan_data.h"
#include "tutti/v1/packer.pb.h"
#include "tutti/v1/plan.pb.h"

namespace tutti::packer {

// RankPlan.plan_version this packer writes (see plan.proto).
inline constexpr uint32_t kPlanVersion = 3;

// Builds the StepPlan for `ranks` (empty: all ranks, in order; otherwise
// sorted and deduplicated). Only the samples and shards those ranks touch
// (LLM docs, encoder items, drawn samples) are included, in batch order;
// shards in first-use order. INVALID_ARGUMENT for a rank outside the world.
// stats.plan_seconds is left 0.
absl::Status BuildStepPlan(const Job& job, const StepPlanData& data,
                           absl::Span<const uint32_t> ranks, v1::StepPlan* plan);

// Checks requested ranks against the world (INVALID_ARGUMENT naming them).
absl::Status CheckRanks(const Job& job, absl::Span<const uint32_t> ranks);

void BuildJobInfo(const Job& job, v1::JobInfo* info);

// Checks a whole step's exchange (every rank's plan) from the wire plans
// alone: both ends of a pair list the same items and runs, and each run's
// items are adjacent in the encoding rank's encoder output (EncoderPhase
// order) and in the LLM rank's embeddings (input_ids order), as long as
// that allows (plan.proto Transfer.runs). INTERNAL naming the step, the pair
// and the run otherwise. Counts the items and messages moved between ranks.
struct ExchangeRunCounts {
  uint64_t items = 0, messages = 0;
};
absl::Status CheckExchangeRuns(const v1::StepPlan& plan, ExchangeRunCounts* counts = nullptr);

// Deterministic serialization of a plan without stats.plan_seconds (the
// plan's identity): equal inputs give equal bytes.
std::string PlanIdentityBytes(v1::StepPlan* plan);
// 16 hex digits over PlanIdentityBytes.
std::string PlanHash(v1::StepPlan* plan);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_PLAN_PROTO_H_
