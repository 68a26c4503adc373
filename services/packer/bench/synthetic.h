// Synthetic datasets as indexes (no shard files behind them): for
// benchmarks, scale tests (10 million samples) and planner tests. The mix
// follows the seed's workload by default: 80% text-only samples with
// lognormal lengths (median 1,000 tokens), 20% VL samples with 1-4 images,
// 90% of them up to 2 MP and 10% up to 16 MP.
#ifndef TUTTI_SERVICES_PACKER_BENCH_SYNTHETIC_H_
#define TUTTI_SERVICES_PACKER_BENCH_SYNTHETIC_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/smart_resize.h"

namespace tutti::packer {

struct SyntheticOptions {
  uint64_t samples = 1000;
  uint64_t seed = 1;
  double vl_fraction = 0.2;
  double text_median_tokens = 1000;  // text-only samples, lognormal
  double text_sigma = 0.8;
  double vl_text_median_tokens = 150;  // the text of VL samples, lognormal
  double vl_text_sigma = 0.8;
  uint32_t min_images = 1;
  uint32_t max_images = 4;
  double big_image_fraction = 0.1;  // images drawn up to big_max_pixels
  double min_pixels = 100000;       // areas are log-uniform in [min, small_max]
  double small_max_pixels = 2e6;    // or [small_max, big_max] for big images
  double big_max_pixels = 16e6;
  double audio_fraction = 0;  // VL samples that carry one audio clip
  uint32_t samples_per_shard = 1000;
  uint32_t max_text_tokens = 30000;  // text lengths are clipped here
  // When fit_seq_len > 0: a sample whose LLM tokens at fit_max_pixels (with
  // `geometry`) exceed fit_seq_len has its images (and text) drawn again.
  uint32_t fit_seq_len = 0;
  uint64_t fit_max_pixels = 0;
  VisionGeometryOptions geometry;
};

// A serialized index (Index::FromString / LoadIndex read it).
absl::StatusOr<std::string> MakeSyntheticIndex(const SyntheticOptions& options);
// The same index written to `path` (atomically), holding a few MiB of it in
// memory at a time however many samples (100 M: about 5 GiB on disk).
absl::Status WriteSyntheticIndex(const SyntheticOptions& options, const std::string& path);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_BENCH_SYNTHETIC_H_
