// The tutti strategy's local search (step 4 of tutti_strategy.cc): pair
// passes and rounds that move or swap samples off a phase's slowest rank
// without raising the other phase above its maximum, and the re-split of
// two ranks' VL samples. Internal to the strategy.
#ifndef TUTTI_SERVICES_PACKER_CORE_TUTTI_SEARCH_H_
#define TUTTI_SERVICES_PACKER_CORE_TUTTI_SEARCH_H_

#include <cstdint>

#include "services/packer/core/packing.h"
#include "services/packer/core/tutti_state.h"

namespace tutti::packer::tutti_internal {

// Per-rank lists of the placed samples and the four heaps of the search.
void StartSearch(const PackProblem& p, State* st);

// Up to kPairPasses pair passes of a phase while they move something,
// charged to its round budget: one round per 2 * kReceivers pairs tried
// (the receivers a ViT round tries).
void Passes(const PackProblem& p, State* st, bool vit_phase, uint64_t budget, uint64_t* rounds);

// One round of a phase: the best change off its slowest rank. False when
// there is none (or the phase sits on its lower bound).
bool Round(const PackProblem& p, State* st, bool vit_phase);

}  // namespace tutti::packer::tutti_internal

#endif  // TUTTI_SERVICES_PACKER_CORE_TUTTI_SEARCH_H_
