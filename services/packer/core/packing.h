// Packing strategies: which rank and which sequence every sample of a step
// goes to in the LLM phase. Text-only and VL samples are packed separately
// (modality segregation): text samples into each rank's text sequences, VL
// samples into its VL sequences, each sequence at most seq_len tokens and at
// most img_cap image tokens.
//
// Strategies (all on the same cost model, selected by name):
//   greedy   one open bin filled in order (the seed's N = 1 baseline)
//   seed-v1  N open bins; an image sample goes to the fitting bin with the
//            fewest image tokens, a text sample to the one with the fewest
//            tokens; when none fits, the fullest bin is emitted as a pack
//   seed-v2  as seed-v1, balancing ViT cost p*(1+p/p_ref) instead
//   tutti    minimises the slowest rank's ViT cost and LLM cost (tokens
//            only fill sequences): largest-first assignment, large text
//            documents first, plus local moves and swaps off the slowest
//            rank that never worsen either phase
//   lpt, kk, multipack, sequential
//            the balancers users would otherwise pick (peer_strategies.cc)
// The seed strategies deal emitted packs to sequence slots in order: pack i
// goes to rank i % W, sequence i / W.
#ifndef TUTTI_SERVICES_PACKER_CORE_PACKING_H_
#define TUTTI_SERVICES_PACKER_CORE_PACKING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tutti::packer {

struct PackItem {
  uint32_t tokens = 0;        // LLM tokens (text + encoder tokens + markers)
  uint32_t image_tokens = 0;  // LLM tokens of its images
  double vit = 0;             // encoder cost that follows the sample's LLM rank
  double llm = 0;             // LLM cost
};

struct PackProblem {
  uint32_t ranks = 1;
  uint32_t seq_len = 0;
  uint32_t img_cap = 0;  // image tokens per sequence; 0 = no cap
  uint32_t text_seqs_per_rank = 0;
  uint32_t vl_seqs_per_rank = 0;
  absl::Span<const PackItem> text;  // in batch order
  absl::Span<const PackItem> vl;
  // True when images are encoded on their sample's LLM rank (pre-balancing):
  // the strategy then balances ViT cost too. False when a dispatcher deals
  // encoder work separately (post-balancing).
  bool balance_vit = true;
  // Items of samples planned before these that the admission's first-fit
  // packing packed with them (overflow.h); only the first-fit fallback reads
  // them. Empty unless admission needed them.
  absl::Span<const PackItem> text_lead, vl_lead;
};

struct PackResult {
  // Per item, rank * seqs_per_rank + sequence (within its modality).
  std::vector<uint32_t> text_slot;
  std::vector<uint32_t> vl_slot;
};

class PackingStrategy {
 public:
  virtual ~PackingStrategy() = default;
  virtual const std::string& name() const = 0;
  // Deterministic. FAILED_PRECONDITION when the items do not fit the slots,
  // naming the modality, tokens and capacity.
  virtual absl::Status Pack(const PackProblem& problem, PackResult* result) const = 0;
};

struct StrategyOptions {
  std::string name = "tutti";         // PackingStrategyNames()
  uint32_t open_bins = 6;             // N for seed-v1/v2
  uint32_t improvement_rounds = 256;  // tutti's local-search rounds per phase, times
                                      // sqrt(ceil(ranks / 64))
};

// INVALID_ARGUMENT naming the unknown strategy and the known ones.
absl::StatusOr<std::unique_ptr<PackingStrategy>> MakeStrategy(const StrategyOptions& options);

// Shared by the strategies: the error for items that do not fit.
absl::Status CapacityError(absl::string_view modality, uint64_t tokens, uint32_t ranks,
                           uint32_t seqs_per_rank, uint32_t seq_len, absl::string_view detail);

// "The samples do not fit": a status so marked (CapacityError, a strategy's
// FAILED_PRECONDITION as the colocated dispatcher passes it on, the
// post-balancing dispatcher's) is what the planner answers with its first-fit
// fallback (overflow.h); any other failure is passed on.
absl::Status AsCapacityError(absl::Status status);
bool IsCapacityError(const absl::Status& status);

// Factories (one per strategy file).
std::unique_ptr<PackingStrategy> MakeSeedStrategy(std::string name, uint32_t open_bins,
                                                  bool balance_vit_cost);
std::unique_ptr<PackingStrategy> MakeTuttiStrategy(uint32_t improvement_rounds);
// lpt, kk, multipack or sequential (peer_strategies.cc); null for another name.
std::unique_ptr<PackingStrategy> MakePeerStrategy(const std::string& name);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_PACKING_H_
