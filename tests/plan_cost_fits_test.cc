// `tutti plan --cost-fits`: a job's record of online cost fits replayed,
// every step planned byte for byte as a planner with the same fits plans it
// in-process (the packer's), the steps before a fit as without it; a record
// of another job or a file that is not there refused naming it.
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/job_config.h"
#include "services/packer/core/cost_schedule.h"
#include "services/packer/core/planner.h"
#include "services/packer/cost_fit_record.h"
#include "services/packer/load_job.h"
#include "services/packer/plan_proto.h"
#include "tests/e2e_support.h"

namespace tutti::e2e {
namespace {

using ::testing::HasSubstr;

// "step N HASH" lines of `tutti plan --format hash`, by step.
std::map<uint64_t, std::string> Hashes(const std::string& output) {
  std::map<uint64_t, std::string> out;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    std::vector<std::string> w = absl::StrSplit(line, ' ');
    if (w.size() == 3 && w[0] == "step") out[std::stoull(w[1])] = w[2];
  }
  return out;
}

TEST(PlanCostFits, ReplaysTheRecordedFitsByteForByte) {
  const std::string dir = MakeTempDir("plan_cost_fits");
  ASSERT_TRUE(GenerateDataset(dir + "/ds").ok());
  ASSERT_TRUE(BuildIndex(dir + "/ds", dir + "/index.tutti").ok());
  const std::string config = dir + "/job.textproto";
  std::ofstream(config) << JobConfigText(dir + "/index.tutti", /*epochs=*/1);
  auto job = packer::LoadJob(config, "");
  ASSERT_TRUE(job.ok()) << job.status();

  // A record as tutti-packerd writes it: one fit, in force from step 2,
  // whose ViT attention term is 4x the configured one and LLM's a half.
  packer::CostFitEntry fit;
  fit.id = 1;
  fit.from_step = 2;
  fit.cost = CostOptions((*job)->config());
  fit.cost.vit_quadratic *= 4;
  fit.cost.llm_quadratic *= 0.5;
  packer::CostFitRecordData data{(*job)->fingerprint(), 2, {fit}};
  const std::string record = dir + "/fits.txt";
  std::ofstream(record) << packer::FormatCostFitRecord(data);

  const std::vector<std::string> plan = {TuttiCli(), "plan",      "--config=" + config,
                                         "--step=0", "--steps=5", "--format=hash"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> argv = plan;
    argv.insert(argv.end(), more.begin(), more.end());
    return RunCommand(argv, absl::Seconds(60));
  };
  RunResult plain = with({});
  ASSERT_EQ(plain.status, 0) << plain.output;
  RunResult fitted = with({"--cost-fits=" + record});
  ASSERT_EQ(fitted.status, 0) << fitted.output;
  const auto plain_hash = Hashes(plain.output), fitted_hash = Hashes(fitted.output);
  ASSERT_EQ(plain_hash.size(), 5u) << plain.output;
  ASSERT_EQ(fitted_hash.size(), 5u) << fitted.output;

  // The packer's planner with the same schedule, in-process.
  packer::CostSchedule schedule(data.fits, data.planned_through);
  const packer::Planner planner(*job, nullptr, &schedule);
  packer::StepPlanData d;
  for (uint64_t s = 0; s < 5; ++s) {
    ASSERT_TRUE(planner.Plan(s, &d).ok());
    v1::StepPlan p;
    ASSERT_TRUE(packer::BuildStepPlan(**job, d, {}, &p).ok());
    EXPECT_EQ(fitted_hash.at(s), packer::PlanHash(&p)) << "step " << s;
    EXPECT_EQ(p.has_cost_fit(), s >= 2) << "step " << s;
    if (s < 2) EXPECT_EQ(fitted_hash.at(s), plain_hash.at(s)) << "before the fit, step " << s;
    if (s >= 2) EXPECT_NE(fitted_hash.at(s), plain_hash.at(s)) << "with the fit, step " << s;
  }

  // Another job's record, a file that is not there, and --check.
  packer::CostFitRecordData other = data;
  other.fingerprint = "0123456789abcdef";
  std::ofstream(dir + "/other.txt") << packer::FormatCostFitRecord(other);
  RunResult r = with({"--cost-fits=" + dir + "/other.txt"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("0123456789abcdef"));
  r = with({"--cost-fits=" + dir + "/none.txt"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("none.txt cannot be read"));
  r = RunCommand({TuttiCli(), "plan", "--config=" + config, "--check", "--cost-fits=" + record},
                 absl::Seconds(60));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--cost-fits"));
  RemoveTree(dir);
}

}  // namespace
}  // namespace tutti::e2e
