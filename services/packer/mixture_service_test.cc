// The mixture in the service: a job over several index files, and the
// per-source metrics of the steps planned.
#include <prometheus/registry.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/packer/combine_index.h"
#include "services/packer/core/planner.h"
#include "services/packer/load_job.h"
#include "services/packer/metrics.h"
#include "services/packer/plan_window.h"
#include "services/packer/testing/mixture_jobs.h"

namespace tutti::packer {
namespace {

namespace fs = std::filesystem;
using testing::MixtureIndex;
using testing::MixtureJob;
using testing::ThreeSources;

// An index of `o` as if `tutti index` had read `source_dir`.
void WriteIndex(MixtureDatasetOptions o, const std::string& source_dir, const std::string& path) {
  auto ix = MixtureIndex(o);
  IndexWriter w;
  w.SetSourceDir(source_dir);
  std::vector<MemberInput> media;
  for (uint32_t sh = 0; sh < ix->num_shards(); ++sh) {
    const IndexShard& shard = ix->shard(sh);
    ASSERT_TRUE(w.AddShard(shard.name, shard.size, shard.crc32c).ok());
    for (uint32_t s = shard.first_sample; s < shard.first_sample + shard.num_samples; ++s) {
      MemberInput text{ix->text_kind(s), std::string(ix->ext(ix->text_ext(s))), ix->text_offset(s),
                       ix->text_size(s)};
      media.clear();
      for (uint32_t j = ix->media_begin(s); j < ix->media_end(s); ++j) {
        const MediaView v = ix->media(j);
        MemberInput m{v.kind, std::string(ix->ext(v.ext)), v.offset, v.size, v.width, v.height};
        media.push_back(m);
      }
      ASSERT_TRUE(w.AddSample(ix->key(s), ix->text_tokens(s), &text, media).ok());
    }
  }
  std::ofstream(path, std::ios::binary) << w.Finish();
}

TEST(MixtureServiceTest, SourcesOnSeveralIndexFiles) {
  const std::string dir = ::testing::TempDir() + "/mixture_files";
  fs::remove_all(dir);
  fs::create_directories(dir);
  MixtureDatasetOptions vl = ThreeSources();
  vl.sources.pop_back();  // ocr and charts
  MixtureDatasetOptions text;
  text.samples_per_shard = 250;
  text.sources = {{"books", 3000, 0}};
  WriteIndex(vl, "/data/finevision", dir + "/fv.idx");
  WriteIndex(text, "/data/text/books-v2", dir + "/text.idx");
  const std::string config = dir + "/job.textproto";
  std::ofstream(config) << MixtureJob(
      4, 24, 8,
      absl::StrCat("mixture {\n",
                   "  sources { name: 'ocr' index_path: '", dir,
                   "/fv.idx' shard_prefixes: 'ocr/' weight: 3 }\n",
                   "  sources { name: 'charts' index_path: '", dir,
                   "/fv.idx' shard_prefixes: 'charts/' weight: 2 }\n",
                   "  sources { name: 'books' index_path: '", dir, "/text.idx' weight: 5 }\n",
                   "}\n"));
  auto job = LoadJob(config, "");
  ASSERT_TRUE(job.ok()) << job.status();
  const Index& ix = (*job)->index();
  EXPECT_EQ(ix.source_dir(), "/data");
  EXPECT_EQ(ix.num_samples(), 3000u + 1500u + 3000u);
  EXPECT_EQ(ix.shard(0).name, "finevision/ocr/000000.tar");
  EXPECT_EQ(ix.shard(ix.num_shards() - 1).name, "text/books-v2/books/000011.tar");
  const Mixture& m = *(*job)->mixture();
  EXPECT_EQ(m.source(0).part[1].n, 3000u);
  EXPECT_EQ(m.source(1).part[1].n, 1500u);
  EXPECT_EQ(m.source(2).part[0].n, 3000u);
  // Each source draws its own samples.
  Planner planner(*job);
  StepPlanData d;
  for (uint64_t step = 0; step < 5; ++step) {
    ASSERT_TRUE(planner.Plan(step, &d).ok());
    for (const PlannedSample& ps : d.samples) {
      const std::string name = (*job)->source_name(ps.source);
      const std::string shard = ix.shard(ps.shard).name;
      EXPECT_NE(shard.find(name == "books" ? "books/" : name + "/"), std::string::npos) << shard;
    }
  }
  // Without the mixture's second file the job is refused naming it.
  std::ofstream(config) << MixtureJob(
      4, 24, 8,
      absl::StrCat("mixture { sources { name: 'books' index_path: '", dir,
                   "/missing.idx' weight: 5 } }\n"));
  auto missing = LoadJob(config, "");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing.idx"), std::string::npos) << missing.status();
}

TEST(MixtureServiceTest, SourceMetricsFollowThePlannedSteps) {
  auto job = testing::MakeJob(
      MixtureJob(4, 24, 8, R"pb(mixture {
                                  sources { name: "ocr" shard_prefixes: "ocr/" weight: 3 }
                                  sources { name: "charts" shard_prefixes: "charts/" weight: 1 }
                                  sources { name: "text" shard_prefixes: "text/" weight: 5 }
                                })pb"),
      MixtureIndex(ThreeSources()));
  ASSERT_TRUE(job.ok()) << job.status();
  prometheus::Registry registry;
  PackerMetrics metrics(registry);
  metrics.SetSources({"ocr", "charts", "text"});
  PlanWindow window(std::make_shared<Planner>(*job), PlanWindowOptions{1, 1}, &metrics);
  ASSERT_TRUE(window.GetBlocking(9).ok());
  window.Stop();
  std::map<std::string, double> samples, epochs;
  for (const auto& family : registry.Collect()) {
    for (const auto& metric : family.metric) {
      if (metric.label.empty() || metric.label[0].name != "source") continue;
      if (family.name == "tutti_packer_source_samples_total") {
        samples[metric.label[0].value] = metric.counter.value;
      } else if (family.name == "tutti_packer_source_epochs") {
        epochs[metric.label[0].value] = metric.gauge.value;
      }
    }
  }
  ASSERT_EQ(samples.size(), 3u);
  ASSERT_EQ(epochs.size(), 3u);
  const double steps = metrics.steps_planned.Value();
  ASSERT_GE(steps, 1);
  // Every step draws 24 text-only samples of 'text' and 8 VL ones, 6 of
  // 'ocr' and 2 of 'charts' (nothing is deferred at this fill).
  EXPECT_EQ(samples["text"], 24 * steps);
  EXPECT_EQ(samples["ocr"], 6 * steps);
  EXPECT_EQ(samples["charts"], 2 * steps);
  EXPECT_GT(epochs["text"], 0);
  EXPECT_NEAR(epochs["ocr"] / epochs["charts"], (6.0 / 3000) / (2.0 / 1500), 1e-9);
}

}  // namespace
}  // namespace tutti::packer
