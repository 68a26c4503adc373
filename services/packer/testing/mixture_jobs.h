// Shared by the mixture's tests: datasets of several sources and their jobs.
#ifndef TUTTI_SERVICES_PACKER_TESTING_MIXTURE_JOBS_H_
#define TUTTI_SERVICES_PACKER_TESTING_MIXTURE_JOBS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/packer/bench/mixture_dataset.h"
#include "services/packer/index/index.h"
#include "services/packer/testing/jobs.h"

namespace tutti::packer::testing {

inline std::shared_ptr<const Index> MixtureIndex(const MixtureDatasetOptions& o) {
  auto bytes = MakeMixtureIndex(o);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  auto index = Index::FromString(*bytes, "mixture.idx");
  EXPECT_TRUE(index.ok()) << index.status();
  return *index;
}

// Three sources: "ocr" and "charts" (VL) and "text" (text-only).
inline MixtureDatasetOptions ThreeSources(uint64_t scale = 1) {
  MixtureDatasetOptions o;
  o.samples_per_shard = 250;
  o.sources = {
      {"ocr", 3000 * scale, 1.0}, {"charts", 1500 * scale, 1.0}, {"text", 4000 * scale, 0}};
  return o;
}

// A job of `world` ranks (2 per node) drawing `text` text-only and `vl` VL
// samples a step, with `mixture` (a text MixtureConfig body) appended.
inline std::string MixtureJob(uint32_t world, uint32_t text, uint32_t vl,
                              const std::string& mixture, const std::string& extra = "") {
  return absl::StrCat(R"pb(
                        seed: 11 index_path: "mixture.idx" world_size:)pb",
                      world, " ranks_per_node: ", world >= 2 ? 2 : 1, R"pb(
                        batch { text_samples_per_step:)pb",
                      text, " vl_samples_per_step: ", vl, R"pb(
      grad_accum: 2
      text_micro_batch: 2
      vl_micro_batch: 1
      text_vl_ratio: "2:1"
      max_patches_per_chunk: 16384
    }
                              curriculum { start_step: 0 max_pixels: 1003520 seq_len: 8192 }
  )pb",
                      extra, "\n", mixture);
}

}  // namespace tutti::packer::testing

#endif  // TUTTI_SERVICES_PACKER_TESTING_MIXTURE_JOBS_H_
