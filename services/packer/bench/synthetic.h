// Synthetic datasets as indexes (no shard files behind them): for
// benchmarks, scale tests (10 million samples) and planner tests. The mix
// is a named workload (common/workload.h), the seed's by default: 80%
// text-only samples with lognormal lengths (median 1,000 tokens), 20% VL
// samples with 1-4 images, 90% of them up to 2 MP and 10% up to 16 MP.
#ifndef TUTTI_SERVICES_PACKER_BENCH_SYNTHETIC_H_
#define TUTTI_SERVICES_PACKER_BENCH_SYNTHETIC_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/smart_resize.h"
#include "common/workload.h"

namespace tutti::packer {

struct SyntheticOptions {
  uint64_t samples = 1000;
  uint64_t seed = 1;
  double vl_fraction = kSeedWorkload.vl_fraction;
  double text_median_tokens = kSeedWorkload.text_median_tokens;  // text-only samples, lognormal
  double text_sigma = kSeedWorkload.text_sigma;
  double vl_text_median_tokens = kSeedWorkload.vl_text_median_tokens;  // VL samples' text
  double vl_text_sigma = kSeedWorkload.vl_text_sigma;
  uint32_t min_images = kSeedWorkload.min_images;
  uint32_t max_images = kSeedWorkload.max_images;
  // Images drawn up to big_max_pixels; areas are log-uniform in [min,
  // small_max], or [small_max, big_max] for big images.
  double big_image_fraction = kSeedWorkload.big_image_fraction;
  double min_pixels = kSeedWorkload.min_pixels;
  double small_max_pixels = kSeedWorkload.small_max_pixels;
  double big_max_pixels = kSeedWorkload.big_max_pixels;
  double audio_fraction = 0;  // VL samples that carry one audio clip
  uint32_t samples_per_shard = 1000;
  uint32_t max_text_tokens = 30000;  // text lengths are clipped here
  // When fit_seq_len > 0: a sample whose LLM tokens at fit_max_pixels (with
  // `geometry`) exceed fit_seq_len has its images (and text) drawn again.
  uint32_t fit_seq_len = 0;
  uint64_t fit_max_pixels = 0;
  VisionGeometryOptions geometry;
};

// `samples` samples of `mix`, the other options at their defaults.
SyntheticOptions SyntheticFromWorkload(const WorkloadMix& mix, uint64_t samples);

// A serialized index (Index::FromString / LoadIndex read it).
absl::StatusOr<std::string> MakeSyntheticIndex(const SyntheticOptions& options);
// The same index written to `path` (atomically), holding a few MiB of it in
// memory at a time however many samples (100 M: about 5 GiB on disk).
absl::Status WriteSyntheticIndex(const SyntheticOptions& options, const std::string& path);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_BENCH_SYNTHETIC_H_
