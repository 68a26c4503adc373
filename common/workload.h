// Named synthetic workloads: the mix of samples that the simulator
// (tools/sim), the packer's benchmarks and synthetic indexes
// (services/packer/bench/synthetic.h), the tests that draw synthetic
// datasets and `tutti gen-dataset` (tools/datagen) all draw from, so that
// their figures describe the same data.
//
// The seed workload follows the seed's training set: text : VL samples
// 8 : 2; of the images, 90% up to 2 MP and 10% up to 16 MP (log-uniform in
// area); sequences of 32,768 tokens. The seed gives no text lengths: text-
// only samples are lognormal with median 1,000 tokens and VL samples' text
// with median 150 (sigma 0.8 both), 1-4 images a VL sample (uniform).
#ifndef TUTTI_COMMON_WORKLOAD_H_
#define TUTTI_COMMON_WORKLOAD_H_

#include <cstdint>

namespace tutti {

struct WorkloadMix {
  double vl_fraction = 0.2;            // samples with images
  double text_median_tokens = 1000;    // text-only samples, lognormal
  double text_sigma = 0.8;             // ... log-space sigma
  double vl_text_median_tokens = 150;  // the text of VL samples, lognormal
  double vl_text_sigma = 0.8;          // ... log-space sigma
  uint32_t min_images = 1;             // images of a VL sample, uniform in
  uint32_t max_images = 4;             // [min_images, max_images]
  double big_image_fraction = 0.1;     // images drawn in [small_max, big_max]
  double min_pixels = 100000;          // the others in [min, small_max],
  double small_max_pixels = 2e6;       // log-uniform in area
  double big_max_pixels = 16e6;
};

// The seed's workload (above): the default of every generator.
inline constexpr WorkloadMix kSeedWorkload{};

// The packer's unit tests' small workload: shorter texts and images up to
// 4 MP, so that samples fit 8,192-token sequences at 1 MP.
inline constexpr WorkloadMix kSmallTestWorkload{
    .text_median_tokens = 400,
    .vl_text_median_tokens = 60,
    .small_max_pixels = 1e6,
    .big_max_pixels = 4e6,
};

}  // namespace tutti

#endif  // TUTTI_COMMON_WORKLOAD_H_
