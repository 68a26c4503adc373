// Synthetic datasets of several sources, as `tutti convert` writes them:
// each source a directory of shards ("name/000000.tar"), text-only or
// vision-language samples. For the mixture's tests and `tutti bench packer`.
#ifndef TUTTI_SERVICES_PACKER_BENCH_MIXTURE_DATASET_H_
#define TUTTI_SERVICES_PACKER_BENCH_MIXTURE_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/packer/index/index.h"

namespace tutti::packer {

struct MixtureDatasetSource {
  std::string name;        // its directory
  uint64_t samples = 0;    // at least 1
  double vl_fraction = 0;  // of its samples, with 1-2 images
};

struct MixtureDatasetOptions {
  std::vector<MixtureDatasetSource> sources;
  uint64_t seed = 1;
  uint32_t samples_per_shard = 1000;
  double text_median_tokens = 400;  // text-only samples, lognormal, at most 3,900
  double vl_text_median_tokens = 80;
  double max_image_pixels = 1.5e6;  // image areas are log-uniform from 20,000
};

// A serialized index of the sources in order (Index::FromString reads it).
absl::StatusOr<std::string> MakeMixtureIndex(const MixtureDatasetOptions& options);

// FineVision's shape: `sources` subsets whose sizes are log-uniform over
// three orders of magnitude (the largest 1,000 x the smallest) and add up to
// about `total_samples`; every fourth text-only, the others VL. Named "s000",
// "s001", ...
MixtureDatasetOptions FineVisionShape(uint32_t sources, uint64_t total_samples, uint64_t seed);

// `mixture { ... }` for the sources of `o`, one per directory, weighted by
// their sizes (`by_size`) or all alike.
std::string MixtureConfigText(const MixtureDatasetOptions& o, bool by_size);

// The samples of `index` re-sharded into sources of FineVision's shape:
// its text-only samples into `text_sources` directories and its VL samples
// into `vl_sources`, each group's sizes log-uniform over three orders of
// magnitude, `samples_per_shard` a shard; the sources (names and sizes) in
// *sources. The samples themselves are the index's: a mixture over them draws
// the same workload as the index's two streams.
absl::StatusOr<std::string> ReshardIntoSources(const Index& index, uint32_t text_sources,
                                               uint32_t vl_sources, uint32_t samples_per_shard,
                                               uint64_t seed,
                                               std::vector<MixtureDatasetSource>* sources);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_BENCH_MIXTURE_DATASET_H_
