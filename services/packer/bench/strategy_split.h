// A packing strategy (packing.h) as a whole-sample split of a dispatcher
// input: pre-balancing as the packer does it, for `tutti bench exchange`'s
// `pre` mode (dispatch/exchange_bench.h), so that pre- and post-balancing are
// measured on the same step.
#ifndef TUTTI_SERVICES_PACKER_BENCH_STRATEGY_SPLIT_H_
#define TUTTI_SERVICES_PACKER_BENCH_STRATEGY_SPLIT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "services/packer/bench/exchange_bench.h"
#include "services/packer/core/packing.h"

namespace tutti::packer {

// Packs `input`'s samples with `strategy` (text-only samples into the ranks'
// text sequences, VL samples into their VL sequences, ViT cost balanced
// along: every image is encoded on its sample's rank) and returns each
// sample's rank. A sample's encoder cost counts its images (the strategies
// balance ViT cost; audio clips follow their sample). FAILED_PRECONDITION
// when the samples do not fit, as the strategy reports.
absl::StatusOr<std::vector<uint32_t>> StrategySplit(const PackingStrategy& strategy,
                                                    const dispatch::DispatchInput& input,
                                                    const dispatch::DispatchOptions& options);

// The hook for ExchangeBenchOptions::pre_balance.
dispatch::PreBalanceFn MakeStrategyPreBalance(std::shared_ptr<const PackingStrategy> strategy);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_BENCH_STRATEGY_SPLIT_H_
