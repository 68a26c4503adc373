// Shared by the packer's tests: jobs over synthetic indexes.
#ifndef TUTTI_SERVICES_PACKER_TESTING_JOBS_H_
#define TUTTI_SERVICES_PACKER_TESTING_JOBS_H_

#include <memory>
#include <string>

#include "common/job_config.h"
#include "gtest/gtest.h"
#include "services/packer/bench/synthetic.h"
#include "services/packer/core/job.h"
#include "services/packer/index/index.h"

namespace tutti::packer::testing {

inline std::shared_ptr<const Index> SyntheticIndex(const SyntheticOptions& o) {
  auto bytes = MakeSyntheticIndex(o);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  auto index = Index::FromString(*bytes, "synthetic.idx");
  EXPECT_TRUE(index.ok()) << index.status();
  return *index;
}

// A small dataset whose samples fit 8192-token sequences at 1 MP.
inline SyntheticOptions SmallDataset(uint64_t samples = 4000) {
  SyntheticOptions o = SyntheticFromWorkload(kSmallTestWorkload, samples);
  o.max_text_tokens = 4000;
  o.fit_seq_len = 8192;
  o.fit_max_pixels = 1003520;
  o.samples_per_shard = 100;
  return o;
}

inline v1::JobConfig Config(const std::string& text) {
  auto c = ParseJobConfig(text, "test");
  EXPECT_TRUE(c.ok()) << c.status();
  v1::JobConfig config = *c;
  ApplyJobDefaults(&config);
  return config;
}

inline absl::StatusOr<std::shared_ptr<const Job>> MakeJob(const std::string& config_text,
                                                          std::shared_ptr<const Index> index) {
  return Job::Create(Config(config_text), std::move(index));
}

// A 4-rank job (2 nodes) over SmallDataset: per rank one text micro-batch of
// 2 sequences and one VL micro-batch of 1, two curriculum stages.
inline const char* kBaseConfig = R"pb(
  seed: 7
  world_size: 4
  ranks_per_node: 2
  batch {
    text_samples_per_step: 24
    vl_samples_per_step: 8
    grad_accum: 2
    text_micro_batch: 2
    vl_micro_batch: 1
    text_vl_ratio: "2:1"
    max_patches_per_chunk: 8192
  }
  curriculum { start_step: 0 max_pixels: 262144 seq_len: 8192 }
  curriculum { start_step: 10 max_pixels: 1003520 seq_len: 8192 }
)pb";

}  // namespace tutti::packer::testing

#endif  // TUTTI_SERVICES_PACKER_TESTING_JOBS_H_
