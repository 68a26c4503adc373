// The packer benchmark's "seed" workload: a synthetic dataset with the
// seed's mix and, per (world size, curriculum stage, strategy), a job config
// whose global batch fills each rank's sequences to a target fill factor.
//
//   seq_len 32,768; 4 sequences per rank per step (text and VL sequences,
//   split so that the drawn text:VL sample counts come closest to the
//   dataset's 80:20); samples 80% text-only, lognormal lengths (median
//   1,000 tokens), 20% VL with 1-4 images, 90% of images up to 2 MP and 10%
//   up to 16 MP, every sample fitting seq_len at 16 MP (images redrawn);
//   curriculum stages max_pixels = 1 MP (1,003,520) and 16 MP (16,777,216).
#ifndef TUTTI_SERVICES_PACKER_BENCH_BENCH_WORKLOAD_H_
#define TUTTI_SERVICES_PACKER_BENCH_BENCH_WORKLOAD_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/packer/bench/synthetic.h"
#include "services/packer/index/index.h"
#include "tutti/v1/job.pb.h"

namespace tutti::packer {

struct SeedWorkloadOptions {
  uint32_t seq_len = 32768;
  uint32_t seqs_per_rank = 4;
  uint32_t ranks_per_node = 8;
  double fill = 0.87;                           // target mean fill of every sequence
  double vl_share = kSeedWorkload.vl_fraction;  // the dataset's share of VL samples
  double audio_fraction = 0;                    // VL samples that also carry an audio clip
  uint32_t samples_per_shard = 1000;
  uint64_t seed = 1;
  // The vision encoder's patch and merge sizes (the job's vision.*): what
  // an image's tokens are counted in.
  uint32_t patch_size = 14;
  uint32_t merge_size = 2;
};

inline constexpr uint64_t kSeedStage1MaxPixels = 1003520;   // "1 MP"
inline constexpr uint64_t kSeedStage2MaxPixels = 16777216;  // "16 MP" (4096 x 4096)

// The synthetic dataset: `samples` samples in the seed's mix, serialized
// (what `tutti index` would write) or loaded.
absl::StatusOr<std::string> MakeSeedIndexBytes(const SeedWorkloadOptions& options,
                                               uint64_t samples);
absl::StatusOr<std::shared_ptr<const Index>> MakeSeedIndex(const SeedWorkloadOptions& options,
                                                           uint64_t samples);
// Its generator options (MakeSyntheticIndex of these is the serialized index).
SyntheticOptions SeedSyntheticOptions(const SeedWorkloadOptions& options, uint64_t samples);

struct SeedStepShape {
  uint32_t text_seqs = 0;  // per rank
  uint32_t vl_seqs = 0;
  uint32_t text_samples = 0;  // per step
  uint32_t vl_samples = 0;
  double mean_text_tokens = 0;
  double mean_vl_tokens = 0;
};

// Chooses the text/VL sequence split and per-step sample counts for
// `ranks` at `max_pixels`, from the index's mean sample sizes at that stage.
absl::StatusOr<SeedStepShape> SeedShape(const SeedWorkloadOptions& options, const Index& index,
                                        uint32_t ranks, uint64_t max_pixels);

// The job config (defaults applied) for one benchmark cell.
v1::JobConfig SeedConfig(const SeedWorkloadOptions& options, const SeedStepShape& shape,
                         uint32_t ranks, uint64_t max_pixels, const std::string& strategy,
                         uint32_t open_bins, bool post_balancing);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_BENCH_BENCH_WORKLOAD_H_
