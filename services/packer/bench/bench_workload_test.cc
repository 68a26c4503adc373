#include "services/packer/bench/bench_workload.h"

#include "gtest/gtest.h"
#include "services/packer/core/job.h"
#include "services/packer/core/planner.h"

namespace tutti::packer {
namespace {

TEST(BenchWorkloadTest, SeedWorkloadFillsSequencesAsAsked) {
  SeedWorkloadOptions o;
  auto index = MakeSeedIndex(o, 20000);
  ASSERT_TRUE(index.ok()) << index.status();
  const double vl_share = double((*index)->vl_samples().size()) / (*index)->num_samples();
  EXPECT_NEAR(vl_share, 0.2, 0.02);
  for (uint64_t px : {kSeedStage1MaxPixels, kSeedStage2MaxPixels}) {
    auto shape = SeedShape(o, **index, 16, px);
    ASSERT_TRUE(shape.ok()) << shape.status();
    EXPECT_EQ(shape->text_seqs + shape->vl_seqs, 4u);
    auto job = Job::Create(SeedConfig(o, *shape, 16, px, "tutti", 6, false), *index);
    ASSERT_TRUE(job.ok()) << job.status();
    for (const StageStats& st : (*job)->stage_stats()) {
      EXPECT_NEAR(st.text_fill, 0.87, 0.02);
      EXPECT_NEAR(st.vl_fill, 0.87, 0.02);
      EXPECT_LE(st.max_tokens, 32768u);  // images redrawn so every sample fits
    }
    Planner planner(*job);
    StepPlanData d;
    ASSERT_TRUE(planner.Plan(0, &d).ok());
  }
}

}  // namespace
}  // namespace tutti::packer
