// `tutti simulate` as a user runs it on a job config: a per-phase balance
// table (and JSON), a stop with the reason at the dataset's end, and clear
// errors for a missing config or a start past the end.
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e_support.h"

namespace tutti::e2e {
namespace {

using ::testing::HasSubstr;

TEST(SimulateCommand, ReportsEveryPhaseAndStopsAtTheEnd) {
  const std::string dir = MakeTempDir("simulate_cmd");
  ASSERT_TRUE(GenerateDataset(dir + "/ds").ok());
  ASSERT_TRUE(BuildIndex(dir + "/ds", dir + "/index.tutti").ok());
  const std::string job = dir + "/job.textproto";
  std::ofstream(job) << JobConfigText(dir + "/index.tutti", /*epochs=*/1);
  auto simulate = [&](std::vector<std::string> flags) {
    std::vector<std::string> argv = {TuttiCli(), "simulate"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return RunCommand(argv, absl::Seconds(60));
  };

  RunResult r = simulate({"--config=" + job, "--steps=3"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("3 steps from step 0, 4 ranks (2 per node)"));
  EXPECT_THAT(r.output, HasSubstr("post-balancing"));
  EXPECT_THAT(r.output, HasSubstr("lower bound"));
  EXPECT_THAT(r.output, HasSubstr("\nvit "));
  EXPECT_THAT(r.output, HasSubstr("\nllm "));
  EXPECT_THAT(r.output, HasSubstr("MB between nodes"));

  r = simulate({"--config=" + job, "--steps=2", "--json"});
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* key : {"\"phase\": \"vit\"", "\"phase\": \"llm\"", "\"imbalance_mean\"",
                          "\"lower_bound_mean\"", "\"wait_share\"", "\"plan_ms_median\""}) {
    EXPECT_THAT(r.output, HasSubstr(key));
  }

  // One epoch of a small dataset: asking for more steps stops at its end.
  r = simulate({"--config=" + job, "--steps=100000"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("stopping at step"));
  r = simulate({"--config=" + job, "--from=100000", "--steps=2"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("100000"));
  r = simulate({"--steps=2"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--config is required"));
  RemoveTree(dir);
}

}  // namespace
}  // namespace tutti::e2e
