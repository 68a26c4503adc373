// Dispatchers decide, for one step, which rank encodes every image (and
// audio clip) and which rank and sequence every sample occupies in the LLM
// phase.
//
//   colocated  pre-balancing: the packing strategy places samples and every
//              image is encoded on its sample's LLM rank (the strategy then
//              balances ViT cost too); exchanges are self-transfers only.
//   lpt        simple post-balancing: images are dealt one by one, largest
//              ViT cost first, to the least-loaded rank; audio likewise; the
//              LLM phase is the strategy's packing without ViT terms. Encoder
//              outputs then travel from encoder rank to LLM rank.
// A node-aware dispatcher (OrchMLLM-style, minimum inter-node bytes) fits
// behind the same interface.
#ifndef TUTTI_SERVICES_PACKER_DISPATCH_H_
#define TUTTI_SERVICES_PACKER_DISPATCH_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "services/packer/packing.h"

namespace tutti::packer {

struct DispatchInput {
  PackProblem pack;  // LLM-phase problem (balance_vit set by dispatcher)
  const PackingStrategy* strategy = nullptr;
  absl::Span<const double> image_cost;     // every image of the batch, batch order
  absl::Span<const uint32_t> image_owner;  // the VL item (index into pack.vl) of each image
  absl::Span<const double> audio_cost;
  absl::Span<const uint32_t> audio_owner;
  uint32_t ranks_per_node = 1;
};

struct DispatchOutput {
  PackResult llm;
  std::vector<uint32_t> image_rank;  // encoder rank of every image
  std::vector<uint32_t> audio_rank;
};

class Dispatcher {
 public:
  virtual ~Dispatcher() = default;
  virtual absl::Status Dispatch(const DispatchInput& in, DispatchOutput* out) const = 0;
};

std::unique_ptr<Dispatcher> MakeColocatedDispatcher();
std::unique_ptr<Dispatcher> MakeLptDispatcher();

// Deals items (costs) to `ranks` bins, largest first onto the least-loaded
// rank (ties: lower index). Writes the rank of every item.
void LptAssign(absl::Span<const double> cost, uint32_t ranks, uint32_t* rank_out);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_DISPATCH_H_
