// Pre-balancing for the benchmark's `pre` mode: one split of whole samples
// (images stay with their sample) that both the encoder and the LLM phase
// then use, as a packer does before the batch is formed.
//
// The hook below is what the benchmark calls; LptPreBalance is the
// stand-in used until the packer's own pre-balancing strategy is wired in
// (the `tutti` strategy of services/packer), at which point the hook is set
// to call that strategy instead.
#ifndef TUTTI_SERVICES_PACKER_DISPATCH_PRE_BALANCE_H_
#define TUTTI_SERVICES_PACKER_DISPATCH_PRE_BALANCE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "services/packer/dispatch/dispatch_types.h"

namespace tutti::dispatch {

// Returns, per sample, the rank it is packed on.
using PreBalanceFn = std::function<absl::StatusOr<std::vector<uint32_t>>(
    const DispatchInput& input, const DispatchOptions& options)>;

// Two LPT passes over whole samples: VL samples by decreasing encoder cost
// (vision plus audio, each divided by its mean per rank) to the rank with the
// least encoder load whose VL sequences have room; then text-only samples by
// decreasing LLM cost to the rank with the least LLM cost (VL documents
// included) whose text sequences have room. RESOURCE_EXHAUSTED when a sample
// fits no rank.
absl::StatusOr<std::vector<uint32_t>> LptPreBalance(const DispatchInput& input,
                                                    const DispatchOptions& options);

}  // namespace tutti::dispatch

#endif  // TUTTI_SERVICES_PACKER_DISPATCH_PRE_BALANCE_H_
