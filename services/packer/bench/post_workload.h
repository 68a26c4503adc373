// The seed workload of the post-balancing benchmark: one step's global batch
// of text-only and vision-language (optionally speech) samples, dealt
// round-robin to the ranks as the sampler draws them. Deterministic in the
// seed on every platform (own generator and distributions).
#ifndef TUTTI_SERVICES_PACKER_BENCH_POST_WORKLOAD_H_
#define TUTTI_SERVICES_PACKER_BENCH_POST_WORKLOAD_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/smart_resize.h"
#include "services/packer/core/post_balancing/dispatch_types.h"

namespace tutti::dispatch {

struct WorkloadOptions {
  uint32_t world_size = 16;
  uint32_t ranks_per_node = 8;
  uint32_t seq_len = 32768;
  // Sequences per rank per step, one sequence per micro-batch: 3 text + 1 VL
  // (4 in all) matches 80% text-only samples at the default lengths.
  uint32_t text_sequences = 3;
  uint32_t vl_sequences = 1;
  // Fraction of each modality's token room the step's samples fill. 0.85.
  double fill = 0.85;
  // Text-only documents: lognormal tokens, median 1000, sigma 1.0.
  double text_median_tokens = 1000;
  double text_sigma = 1.0;
  // Text of a VL document: lognormal, median 200, sigma 0.8.
  double vl_text_median_tokens = 200;
  double vl_text_sigma = 0.8;
  // 1..max_images images per VL sample (uniform).
  uint32_t max_images = 4;
  // Source image area: with large_image_fraction uniform in (small_max_mp,
  // large_max_mp], else uniform in [min_mp, small_max_mp]; aspect ratio
  // log-uniform in [1/2, 2]. Defaults 10%, 2 MP, 16 MP, 0.05 MP.
  double large_image_fraction = 0.1;
  double min_mp = 0.05;
  double small_max_mp = 2.0;
  double large_max_mp = 16.0;
  // Smart resize (max_pixels is the curriculum stage: 1,003,520 ~ 1 MP).
  VisionGeometryOptions geometry;
  uint32_t pixel_dtype_bytes = 4;  // float32 pixel_values
  // Fraction of VL-modality samples that are speech samples instead (one
  // audio clip of 1..30 s, 25 encoder tokens per second). Default 0.
  double audio_share = 0.0;
  uint32_t audio_sample_rate = 16000;  // input bytes: seconds * rate * 4 (float32)
  uint32_t shards = 4096;              // samples spread uniformly over shards
  // Nodes whose stager has each shard: 0 (default) every node; k > 0: shard
  // s on nodes s, s+1, ..., s+k-1 (mod the node count).
  uint32_t shard_nodes = 0;
  uint64_t seed = 1;
};

struct Workload {
  DispatchInput input;
  DispatchOptions options;  // cluster and sequence layout of the workload
  uint32_t text_samples = 0;
  uint32_t vl_samples = 0;
  uint32_t images = 0;
  uint32_t audio_clips = 0;
  uint32_t rejected = 0;  // drawn samples longer than seq_len, drawn again
};

// INVALID_ARGUMENT for options that describe no workload (named).
absl::StatusOr<Workload> GenerateWorkload(const WorkloadOptions& options);

}  // namespace tutti::dispatch

#endif  // TUTTI_SERVICES_PACKER_BENCH_POST_WORKLOAD_H_
