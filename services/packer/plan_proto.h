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
inline constexpr uint32_t kPlanVersion = 4;

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
// alone, as the client reads it (plan.proto Exchange, plan_version 4): both
// ends of a pair list the same items in the same order, images before audio
// clips; each rank's sends, per encoder, are its encoder output's rows in
// order (so a pair is one contiguous run of each encoder's output); and
// each rank receives exactly the items of its documents. INTERNAL naming
// the step, the pair and the item otherwise. Counts the items moved between
// ranks, the pairs that move them (one message each over a contiguous
// buffer) and the pairs' runs per encoder (one message each when each
// encoder's output moves on its own).
struct ExchangeLayoutCounts {
  uint64_t items = 0, pairs = 0, runs = 0;
};
absl::Status CheckExchangeLayout(const v1::StepPlan& plan, ExchangeLayoutCounts* counts = nullptr);

// Deterministic serialization of a plan without stats.plan_seconds (the
// plan's identity): equal inputs give equal bytes.
std::string PlanIdentityBytes(v1::StepPlan* plan);
// 16 hex digits over PlanIdentityBytes.
std::string PlanHash(v1::StepPlan* plan);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_PLAN_PROTO_H_
