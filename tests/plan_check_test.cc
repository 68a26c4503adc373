// `tutti plan --check`: the CLI over hundreds of steps at several world sizes,
// with post-balancing on and off, on a dataset and config written by `tutti
// bench packer`; and the check it runs (CheckPlan) catching corrupted plans.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/packer/bench/bench_workload.h"
#include "services/packer/core/job.h"
#include "services/packer/core/planner.h"
#include "tools/plan_cmd_check.h"

namespace tutti {
namespace {

namespace fs = std::filesystem;

std::string Output(const std::string& command, int* rc) {
  FILE* f = popen(command.c_str(), "r");
  if (f == nullptr) return "popen failed";
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  const int status = pclose(f);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(PlanCheckCliTest, EveryPlanPassesAtSeveralWorldSizesWithAndWithoutPostBalancing) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/plan-check-", getpid(), "-", rand());
  fs::create_directories(dir);
  int rc = 0;
  const std::string bench =
      Output(absl::StrCat(TUTTI_CLI, " bench packer --ranks 8 --stages 1003520 --steps 1 ",
                          "--build-steps 0 --strategies tutti --samples 12000 --fill 0.7 --json ",
                          "--hashes ", dir, " 2>&1"),
             &rc);
  ASSERT_EQ(rc, 0) << bench;
  const std::string config = dir + "/W8-px1003520-tutti.textproto";
  ASSERT_TRUE(fs::exists(config)) << bench;
  for (uint32_t world : {8u, 16u, 64u}) {
    for (const char* post : {"off", "on"}) {
      const std::string out =
          Output(absl::StrCat(TUTTI_CLI, " plan --config ", config, " --index ", dir,
                              "/index.idx --check --quiet --steps 300 --world-size ", world,
                              " --post-balancing ", post, " 2>&1"),
                 &rc);
      EXPECT_EQ(rc, 0) << out;
      EXPECT_TRUE(absl::StrContains(out, absl::StrCat("checked 300 steps at W=", world, " (")))
          << out;
      EXPECT_TRUE(absl::StrContains(
          out, absl::StrCat("post-balancing ", post, "): 0 violations, 0 not planned")))
          << out;
    }
  }
  // One line per step without --quiet.
  const std::string table = Output(absl::StrCat(TUTTI_CLI, " plan --config ", config, " --index ",
                                                dir, "/index.idx --check --step 5 --steps 3 2>&1"),
                                   &rc);
  EXPECT_EQ(rc, 0) << table;
  for (const char* step : {"       5 ", "       6 ", "       7 "}) {
    EXPECT_TRUE(absl::StrContains(table, step)) << table;
  }
  fs::remove_all(dir);
}

// `tutti bench packer --index`: every peer on an index file's samples, a
// seq_len per stage, each strategy's failed steps, and configs naming that
// index whose plans `tutti plan` reproduces.
TEST(BenchPackerIndexTest, PlansAnIndexFileWithASeqLenPerStage) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/bench-index-", getpid(), "-", rand());
  fs::create_directories(dir + "/data");
  fs::create_directories(dir + "/cells");
  int rc = 0;
  std::string out =
      Output(absl::StrCat(TUTTI_CLI, " bench packer --ranks 8 --stages 1003520 ",
                          "--steps 1 --build-steps 0 --strategies lpt --samples 12000 ",
                          "--hashes ", dir, "/data 2>&1"),
             &rc);
  ASSERT_EQ(rc, 0) << out;
  // The progress line counts the steps the cell planned (stderr).
  EXPECT_TRUE(absl::StrContains(out, "lpt          1 steps planned, 0 failed in ")) << out;
  const std::string index = dir + "/data/index.idx";
  out = Output(absl::StrCat(TUTTI_CLI, " bench packer --index ", index,
                            " --ranks 8 --stages 262144,1003520 --seq-lens 8192,16384 --steps 2 ",
                            "--build-steps 0 --strategies tutti,lpt,kk,multipack,sequential ",
                            "--json --hashes ", dir, "/cells 2>/dev/null"),
               &rc);
  ASSERT_EQ(rc, 0) << out;
  for (const char* strategy : {"tutti", "lpt", "kk", "multipack", "sequential"}) {
    for (const char* stage : {"\"max_pixels\": 262144, \"seq_len\": 8192",
                              "\"max_pixels\": 1003520, \"seq_len\": 16384"}) {
      EXPECT_TRUE(absl::StrContains(out, absl::StrCat("{\"strategy\": \"", strategy,
                                                      "\", \"bins\": 0, \"ranks\": 8, ", stage)))
          << strategy << " " << stage << "\n"
          << out;
    }
  }
  EXPECT_TRUE(absl::StrContains(out, "\"steps\": 2, \"failed_steps\": 0")) << out;
  const std::string config = dir + "/cells/W8-px262144-kk.textproto";
  ASSERT_TRUE(fs::exists(config));
  std::ifstream hashes_file(dir + "/cells/W8-px262144-kk.hashes");
  const std::string hashes((std::istreambuf_iterator<char>(hashes_file)),
                           std::istreambuf_iterator<char>());
  EXPECT_EQ(Output(absl::StrCat(TUTTI_CLI, " plan --config ", config, " --index ", index,
                                " --steps 2 --format hash"),
                   &rc),
            hashes);
  EXPECT_EQ(rc, 0);
  fs::remove_all(dir);
}

// The checks the CLI runs catch plans that break what the job says.
TEST(PlanCheckTest, CorruptedPlansAreCaught) {
  packer::SeedWorkloadOptions wo;
  wo.fill = 0.7;
  auto index = packer::MakeSeedIndex(wo, 12000);
  ASSERT_TRUE(index.ok()) << index.status();
  auto shape = packer::SeedShape(wo, **index, 8, packer::kSeedStage1MaxPixels);
  ASSERT_TRUE(shape.ok()) << shape.status();
  for (bool post : {false, true}) {
    auto job = packer::Job::Create(
        packer::SeedConfig(wo, *shape, 8, packer::kSeedStage1MaxPixels, "tutti", 1, post), *index);
    ASSERT_TRUE(job.ok()) << job.status();
    const tools::PlanCheckSummary summary = tools::CheckSteps(*job, 0, 40);
    EXPECT_TRUE(summary.ok()) << tools::FormatPlanCheck(**job, summary, false);
    EXPECT_EQ(summary.steps.size(), 40u);

    packer::Planner planner(*job);
    packer::StepPlanData d;
    ASSERT_TRUE(planner.Plan(3, &d).ok());
    ASSERT_TRUE(tools::CheckPlan(**job, d).ok());
    ASSERT_GE(d.samples.size(), 2u);
    // A sample twice in the step (the second draw replaced by the first).
    packer::StepPlanData twice = d;
    twice.samples[1].sample = twice.samples[0].sample;
    EXPECT_FALSE(tools::CheckPlan(**job, twice).ok()) << post;
    // A sample costed at another stage's figures.
    packer::StepPlanData cost = d;
    cost.samples[0].cost.llm_tokens += 1;
    EXPECT_FALSE(tools::CheckPlan(**job, cost).ok()) << post;
    // A text sample moved into a VL sequence of its rank.
    packer::StepPlanData moved = d;
    moved.samples[0].seq = d.text_seqs;
    EXPECT_FALSE(tools::CheckPlan(**job, moved).ok()) << post;
    // Every text sample of rank 0 in its first sequence: past seq_len.
    packer::StepPlanData full = d;
    uint64_t tokens = 0;
    for (packer::PlannedSample& ps : full.samples) {
      if (ps.vl || ps.rank != 0) continue;
      ps.seq = 0;
      tokens += ps.cost.llm_tokens;
    }
    if (tokens > d.seq_len) {
      EXPECT_FALSE(tools::CheckPlan(**job, full).ok()) << post;
    }
    // Another LLM imbalance than the placement gives.
    if (!d.phases_from_dispatcher) {
      packer::StepPlanData wrong = d;
      wrong.llm.max *= 1.01;
      wrong.llm.imbalance *= 1.01;
      const absl::Status s = tools::CheckPlan(**job, wrong);
      EXPECT_FALSE(s.ok()) << post;
      EXPECT_TRUE(absl::StrContains(s.message(), "LLM")) << s;
    }
    // The summary counts a violation and names the step.
    tools::PlanCheckSummary bad;
    tools::StepCheck& c = bad.steps.emplace_back();
    c.step = 3;
    c.planned = true;
    c.status = tools::CheckPlan(**job, twice);
    bad.violations = 1;
    const std::string text = tools::FormatPlanCheck(**job, bad, false);
    EXPECT_TRUE(absl::StrContains(text, "VIOLATION: step 3")) << text;
    EXPECT_TRUE(absl::StrContains(text, "1 violations")) << text;
  }
}

}  // namespace
}  // namespace tutti
