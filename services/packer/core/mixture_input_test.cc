// A mixture's bad inputs, refused when the job is created, each naming the
// field and the fix; and the per-source settings (max_pixels ceiling,
// long-document policy, epoch cap) doing what they say.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "services/packer/core/planner.h"
#include "services/packer/plan_proto.h"
#include "services/packer/testing/mixture_jobs.h"

namespace tutti::packer {
namespace {

using testing::MakeJob;
using testing::MixtureIndex;
using testing::MixtureJob;
using testing::ThreeSources;

std::shared_ptr<const Index> Three() {
  static auto* index = new std::shared_ptr<const Index>(MixtureIndex(ThreeSources()));
  return *index;
}

// The sources of ThreeSources with `extra` inside the mixture block.
std::string Mixture3(const std::string& ocr = "weight: 3", const std::string& charts = "weight: 2",
                     const std::string& text = "weight: 5", const std::string& extra = "") {
  return absl::StrCat("mixture {\n  sources { name: 'ocr' shard_prefixes: 'ocr/' ", ocr,
                      " }\n  sources { name: 'charts' shard_prefixes: 'charts/' ", charts,
                      " }\n  sources { name: 'text' shard_prefixes: 'text/' ", text, " }\n  ",
                      extra, "\n}\n");
}

// The job's error: it must be refused, and name every one of `want`.
void ExpectRefused(const std::string& mixture, std::vector<std::string> want, uint32_t text = 24,
                   uint32_t vl = 8) {
  auto config = testing::Config(MixtureJob(4, text, vl, mixture));
  auto job = Job::Create(config, Three());
  ASSERT_FALSE(job.ok()) << "accepted: " << mixture;
  for (const std::string& w : want) {
    EXPECT_NE(job.status().message().find(w), std::string::npos)
        << "'" << w << "' not in: " << job.status().message();
  }
}

TEST(MixtureInputTest, WeightsMustBeFiniteSharesAndNotAllZero) {
  ExpectRefused(Mixture3("weight: -0.5"), {"mixture.sources[0].weight is -0.5", "from 0"});
  ExpectRefused(Mixture3("weight: nan"), {"mixture.sources[0].weight is nan", "finite share"});
  ExpectRefused(Mixture3("weight: inf"), {"mixture.sources[0].weight is inf"});
  ExpectRefused(Mixture3("weight: 2e9"), {"mixture.sources[0].weight", "1e9"});
  ExpectRefused(Mixture3("weight: 0", "weight: 0", "weight: 0"),
                {"every mixture.sources[].weight is 0", "give the sources their weights"});
  ExpectRefused(Mixture3("weight: 1", "weight: 1", "weight: 1",
                         "stages { start_step: 5 weights { source: 'ocr' weight: 0 } "
                         "weights { source: 'charts' weight: 0 } weights { source: 'text' "
                         "weight: 0 } }"),
                {"mixture.stages[0]", "leaves every source at weight 0"});
  ExpectRefused(Mixture3("weight: 1", "weight: 1", "weight: 1",
                         "stages { start_step: 5 weights { source: 'ocr' weight: -1 } }"),
                {"mixture.stages[0].weights[0].weight is -1"});
}

TEST(MixtureInputTest, AStreamTheBatchNeedsNeedsASourceWithWeight) {
  // Every VL source at 0 from step 5 while the batch draws VL samples.
  ExpectRefused(Mixture3("weight: 1", "weight: 1", "weight: 1",
                         "stages { start_step: 5 weights { source: 'ocr' weight: 0 } "
                         "weights { source: 'charts' weight: 0 } }"),
                {"mixture.stages[0] (from step 5)", "every source holding VL samples",
                 "ocr, charts", "batch.vl_samples_per_step is 8", "give one of them a weight"});
  // No source holds VL samples at all.
  ExpectRefused("mixture { sources { name: 'text' shard_prefixes: 'text/' weight: 1 } }",
                {"batch.vl_samples_per_step is 8 but no mixture source holds VL samples",
                 "set batch.vl_samples_per_step to 0"});
}

TEST(MixtureInputTest, ASourceWithoutTheModalityItNames) {
  ExpectRefused(
      Mixture3("weight: 3", "weight: 2", "weight: 5 modality: MODALITY_VL"),
      {"mixture.sources[2] ('text')", "that are vision-language", "leave its modality unset"});
}

TEST(MixtureInputTest, TwoSourcesNamingTheSameShards) {
  ExpectRefused(Mixture3("weight: 3", "weight: 2", "weight: 5",
                         "sources { name: 'again' shard_prefixes: 'ocr/0' weight: 1 }"),
                {"mixture.sources[3] ('again') and mixture.sources[0] ('ocr') both name shard "
                 "ocr/000000.tar",
                 "narrow their shard_prefixes"});
  // A source without prefixes takes every shard: it overlaps every other.
  ExpectRefused(
      "mixture { sources { name: 'all' weight: 1 } sources { name: 'ocr' "
      "shard_prefixes: 'ocr/' weight: 1 } }",
      {"both name shard ocr/000000.tar"});
}

TEST(MixtureInputTest, ASchedulesOnlyGoesForward) {
  ExpectRefused(Mixture3("weight: 3", "weight: 2", "weight: 5",
                         "stages { start_step: 10 } stages { start_step: 4 }"),
                {"mixture.stages[1].start_step 4 is not after mixture.stages[0].start_step 10",
                 "increasing start_step"});
  ExpectRefused(Mixture3("weight: 3", "weight: 2", "weight: 5",
                         "stages { start_step: 10 } stages { start_step: 10 }"),
                {"mixture.stages[1].start_step 10 is not after"});
  ExpectRefused(
      Mixture3("weight: 3", "weight: 2", "weight: 5",
               "stages { start_step: 10 ramp_steps: 20 } stages { start_step: 20 }"),
      {"mixture.stages[0].ramp_steps 20 runs past mixture.stages[1].start_step 20", "at most 10"});
}

TEST(MixtureInputTest, AMixtureThatCannotFillAStep) {
  // 'charts' would take 90% of the VL draw: more than half its epoch a step.
  ExpectRefused(Mixture3("weight: 1", "weight: 9 max_samples_per_epoch: 600", "weight: 5"),
                {"mixture.sources[1] ('charts') holds 1500 VL samples (a source-epoch of 600)",
                 "up to 584 of the 648", "at or below 300", "raise max_samples_per_epoch"},
                24, 648);
}

TEST(MixtureInputTest, NamesAndSettings) {
  ExpectRefused(Mixture3("weight: 3", "weight: 2", "weight: 5",
                         "stages { start_step: 3 weights { source: 'oops' weight: 1 } }"),
                {"mixture.stages[0].weights[0].source 'oops' is not a source of the mixture"});
  ExpectRefused("mixture { sources { name: 'a b' weight: 1 } }",
                {"mixture.sources[0].name 'a b' is not a source name"});
  ExpectRefused(
      "mixture { sources { name: 'x' shard_prefixes: 'ocr/' weight: 1 } sources { "
      "name: 'x' shard_prefixes: 'text/' weight: 1 } }",
      {"mixture.sources[1].name 'x' is also mixture.sources[0]'s"});
  ExpectRefused("mixture { sources { name: 'ocr' shard_prefixes: 'nope/' weight: 1 } }",
                {"mixture.sources[0] ('ocr') selects no shard", "starts with nope/",
                 "fix its shard_prefixes"});
  ExpectRefused(Mixture3("weight: 3 max_pixels: 1000"),
                {"mixture.sources[0].max_pixels 1000 is below vision.min_pixels"});
  ExpectRefused(Mixture3("weight: 3 max_pixels: 100000000000"),
                {"mixture.sources[0].max_pixels 100000000000 is outside its range 0..67108864"});
  ExpectRefused(Mixture3("weight: 3 long_documents: 'fold'"),
                {"mixture.sources[0].long_documents 'fold' is unknown"});
  ExpectRefused("mixture { }", {"mixture has no sources"});
}

TEST(MixtureInputTest, ASourceCeilingPlansItsImagesSmaller) {
  const uint64_t ceiling = 50176;  // 224 x 224
  auto job = MakeJob(
      MixtureJob(4, 24, 8, Mixture3("weight: 3", absl::StrCat("weight: 2 max_pixels: ", ceiling))),
      Three());
  ASSERT_TRUE(job.ok()) << job.status();
  Planner planner(*job);
  StepPlanData d;
  uint64_t charts = 0, ocr_over = 0;
  for (uint64_t step = 0; step < 10; ++step) {
    ASSERT_TRUE(planner.Plan(step, &d).ok());
    for (const PlannedImage& im : d.images) {
      const PlannedSample& ps = d.samples[im.owner];
      const uint64_t pixels = uint64_t{im.height} * im.width;
      if ((*job)->source_name(ps.source) == "charts") {
        ++charts;
        EXPECT_LE(pixels, ceiling);
      } else if (pixels > ceiling) {
        ++ocr_over;
      }
    }
    v1::StepPlan plan;
    ASSERT_TRUE(BuildStepPlan(**job, d, {}, &plan).ok());
    for (const v1::SampleInfo& s : plan.samples()) {
      EXPECT_EQ(s.max_pixels(), (*job)->source_name(s.source()) == "charts" ? ceiling : 0u);
    }
  }
  EXPECT_GT(charts, 0u);
  EXPECT_GT(ocr_over, 0u) << "the other source's images keep the stage's max_pixels";
}

TEST(MixtureInputTest, ASourcesLongDocumentPolicy) {
  MixtureDatasetOptions o;
  o.samples_per_shard = 250;
  o.text_median_tokens = 700;
  o.sources = {{"cut", 3000, 0}, {"keep", 3000, 0}, {"vl", 2000, 1.0}};
  auto index = MixtureIndex(o);
  const std::string mixture =
      R"pb(mixture {
             sources { name: "cut" shard_prefixes: "cut/" weight: 1 long_documents: "skip" }
             sources { name: "keep" shard_prefixes: "keep/" weight: 1 }
             sources { name: "vl" shard_prefixes: "vl/" weight: 1 }
           })pb";
  std::string config = MixtureJob(4, 8, 4, mixture, "overflow { max_skip_fraction: 1 }");
  config = absl::StrReplaceAll(config, {{"seq_len: 8192", "seq_len: 2048"}});
  auto job = MakeJob(config, index);
  ASSERT_TRUE(job.ok()) << job.status();
  Planner planner(*job);
  StepPlanData d;
  std::vector<uint64_t> skipped;
  uint64_t split = 0;
  for (uint64_t step = 0; step < 40; ++step) {
    ASSERT_TRUE(planner.Plan(step, &d).ok()) << step;
    skipped.insert(skipped.end(), d.skipped_text.begin(), d.skipped_text.end());
    for (const PlannedSample& ps : d.samples) {
      if (ps.pieces > 0 && !ps.vl) {
        ++split;
        EXPECT_EQ((*job)->source_name(ps.source), "keep");
      }
    }
  }
  ASSERT_FALSE(skipped.empty());
  EXPECT_GT(split, 0u);
  std::vector<uint32_t> ids(skipped.size());
  std::vector<uint8_t> src(skipped.size());
  (*job)->DrawSamples(false, skipped.data(), skipped.size(), ids.data(), src.data());
  for (uint8_t s : src) EXPECT_EQ((*job)->source_name(s), "cut");
}

TEST(MixtureInputTest, JobInfoNamesTheSources) {
  auto job = MakeJob(MixtureJob(4, 24, 8, Mixture3()), Three());
  ASSERT_TRUE(job.ok()) << job.status();
  v1::JobInfo info;
  BuildJobInfo(**job, &info);
  ASSERT_EQ(info.sources_size(), 3);
  EXPECT_EQ(info.sources(0).name(), "ocr");
  EXPECT_EQ(info.sources(0).vl_samples(), 3000u);
  EXPECT_EQ(info.sources(2).text_samples(), 4000u);
  ASSERT_EQ(info.mixture_history_size(), 1);
  EXPECT_EQ(info.mixture_history(0).start_step(), 0u);
  // Without a mixture: the two streams.
  auto plain = MakeJob(testing::kBaseConfig, testing::SyntheticIndex(testing::SmallDataset()));
  ASSERT_TRUE(plain.ok()) << plain.status();
  v1::JobInfo p;
  BuildJobInfo(**plain, &p);
  ASSERT_EQ(p.sources_size(), 2);
  EXPECT_EQ(p.sources(0).name(), "text");
  EXPECT_EQ(p.sources(1).name(), "vl");
  EXPECT_EQ(p.mixture_history_size(), 0);
}

}  // namespace
}  // namespace tutti::packer
