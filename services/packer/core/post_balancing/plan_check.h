// An independent check of a dispatch plan against its input: what the
// planner promises, verified from the plan's own lists. Cheap enough to run
// on every plan in debug builds and in tests.
#ifndef TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_PLAN_CHECK_H_
#define TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_PLAN_CHECK_H_

#include <vector>

#include "absl/status/status.h"
#include "services/packer/core/post_balancing/dispatch_types.h"

namespace tutti::dispatch {

// OK when:
//  - every encoder item is in exactly one rank's list, the rank its `rank`
//    entry names, and remote_load is set exactly when that rank's node does
//    not stage the item's shard, with a load source on a node that does;
//  - every sample is a document of exactly one sequence, of its modality,
//    on llm_rank[sample], and no sequence holds more than seq_len tokens;
//  - the forward exchange sends every encoder output exactly once, from its
//    encoder rank to its sample's LLM rank, with the embedding byte count, and
//    every send list matches the receiver's list item for item;
//  - the load exchange carries exactly the remote inputs and remote token ids;
//  - byte totals add up.
// INTERNAL with a message naming the first violation otherwise.
absl::Status CheckPlan(const DispatchInput& input, const DispatchOptions& options,
                       const DispatchPlan& plan);

// Sender and receiver lists agree: rank r's send to p lists the same items,
// in the same order, with the same bytes as p's receive from r.
absl::Status CheckExchangeSymmetry(const std::vector<RankExchange>& exchange);

}  // namespace tutti::dispatch

#endif  // TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_PLAN_CHECK_H_
