// Shared by the packer's locality tests: a 16-rank job on 8 nodes over
// 6,000 synthetic samples, and a planned step as the wire has it.
#ifndef TUTTI_SERVICES_PACKER_TESTING_LOCALITY_JOBS_H_
#define TUTTI_SERVICES_PACKER_TESTING_LOCALITY_JOBS_H_

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/packer/core/job.h"
#include "services/packer/core/planner.h"
#include "services/packer/plan_proto.h"
#include "services/packer/testing/jobs.h"

namespace tutti::packer::testing {

inline std::shared_ptr<const Index> LocalityDataset() {
  static auto* index = new std::shared_ptr<const Index>(SyntheticIndex(SmallDataset(6000)));
  return *index;
}

// 16 ranks on 8 nodes at 1 MP; `extra` adds post-balancing, locality, ...
inline std::string LocalityJobText(const std::string& extra) {
  return absl::StrCat(R"pb(
                        seed: 7
                        world_size: 16
                        ranks_per_node: 2
                        batch {
                          text_samples_per_step: 64
                          vl_samples_per_step: 48
                          grad_accum: 2
                          text_micro_batch: 2
                          vl_micro_batch: 2
                          text_vl_ratio: "1:1"
                          max_patches_per_chunk: 8192
                        }
                        curriculum { start_step: 0 max_pixels: 1003520 seq_len: 8192 }
                      )pb",
                      extra);
}

// That job with post-balancing and `locality` (one home per shard when
// empty).
inline std::shared_ptr<const Job> LocalityJob(const std::string& locality = "") {
  auto job = Job::Create(Config(LocalityJobText(absl::StrCat(
                             "post_balancing { enabled: true } ",
                             locality.empty() ? "locality { home_replication: 1 }" : locality))),
                         LocalityDataset());
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : nullptr;
}

// Step `step` of `planner` as the wire has it, or the error's text.
inline std::string PlanBytes(const Planner& planner, uint64_t step) {
  StepPlanData d;
  v1::StepPlan plan;
  absl::Status s = planner.Plan(step, &d);
  if (s.ok()) s = BuildStepPlan(planner.job(), d, {}, &plan);
  return s.ok() ? plan.SerializeAsString() : s.ToString();
}

}  // namespace tutti::packer::testing

#endif  // TUTTI_SERVICES_PACKER_TESTING_LOCALITY_JOBS_H_
