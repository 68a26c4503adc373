// The seed's open-bin heuristics over a continuous stream of samples, as the
// seed describes them (its section on bin packing for even image workload):
// N bins stay open across steps; an image sample goes to the bin with the
// fewest image tokens (seed-v1) or the least ViT cost (seed-v2), a text
// sample to the bin with the fewest tokens, among the bins it fits (seq_len
// tokens, img_cap image tokens); when it fits none, the fullest bin (most
// tokens) is emitted as a pack and a new bin takes its place. Text and image
// samples share bins, as in the seed. The per-step strategies of
// seed_strategy.cc are the same rule restricted to one step and one modality.
#ifndef TUTTI_SERVICES_PACKER_CORE_SEED_STREAM_H_
#define TUTTI_SERVICES_PACKER_CORE_SEED_STREAM_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "services/packer/core/packing.h"

namespace tutti::packer {

struct SeedStreamOptions {
  uint32_t open_bins = 6;  // N (>= 1)
  bool vit_cost = false;   // false: seed-v1 (image tokens), true: seed-v2 (ViT cost)
  uint32_t seq_len = 0;    // tokens per pack
  uint32_t img_cap = 0;    // image tokens per pack; 0 = no cap
};

// One emitted pack.
struct StreamPack {
  uint32_t tokens = 0;
  uint32_t image_tokens = 0;
  double vit = 0;
  uint32_t items = 0;
  uint64_t first_item = 0, last_item = 0;  // stream positions of its first and last sample
};

class SeedStreamPacker {
 public:
  explicit SeedStreamPacker(const SeedStreamOptions& options);

  // Places the stream's next sample; packs emitted to make room are appended
  // to *emitted. FAILED_PRECONDITION for a sample larger than one pack.
  absl::Status Add(const PackItem& item, std::vector<StreamPack>* emitted);
  // Emits every open bin that holds a sample (the end of the stream).
  void Flush(std::vector<StreamPack>* emitted);

 private:
  SeedStreamOptions o_;
  std::vector<StreamPack> open_;
  uint64_t next_item_ = 0;
};

// Mean and standard deviation (population) of the packs' image tokens.
struct PackSpread {
  uint64_t packs = 0;
  double image_tokens_mean = 0, image_tokens_std = 0;
  double tokens_mean = 0, vit_std = 0;
};
PackSpread MeasurePacks(const std::vector<StreamPack>& packs);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_SEED_STREAM_H_
