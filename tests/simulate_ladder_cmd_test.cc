// `tutti simulate --ladder` and `--fit-experiment` as a user runs them: the
// ablation ladder on the seed workload as a table, JSON and a PNG, the
// online fit's experiment, and every bad input refused naming it.
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e_support.h"

namespace tutti::e2e {
namespace {

using ::testing::HasSubstr;

TEST(SimulateLadderCommand, TheLadderTheFitExperimentAndTheirBadInputs) {
  const std::string dir = MakeTempDir("simulate_ladder");
  const std::string index = dir + "/index.tutti";
  ASSERT_TRUE(GenerateDataset(dir + "/ds").ok());
  ASSERT_TRUE(BuildIndex(dir + "/ds", index).ok());
  auto simulate = [&](std::vector<std::string> flags, std::vector<std::string> env = {}) {
    std::vector<std::string> argv = {TuttiCli(), "simulate"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return RunCommand(argv, absl::Seconds(60), env);
  };
  const std::vector<std::string> small = {"--ladder", "--world-sizes=8", "--steps=2",
                                          "--samples=20000"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> f = small;
    f.insert(f.end(), more.begin(), more.end());
    return f;
  };

  RunResult r = simulate(small);
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* row : {"\nnaive ", "\n+ staging, prefetch ", "\n+ modality segregation ",
                          "\n+ max-pixel curriculum ", "\n+ seed-v1 ", "\n+ seed-v2 ",
                          "\n+ post-balancing ", "\ntutti ", "sync allreduce", "sync fsdp",
                          "stage max_pixels 1.0 MP", "stage max_pixels 17 MP"}) {
    EXPECT_THAT(r.output, HasSubstr(row));
  }
  r = simulate(with({"--json", "--sync=fsdp", "--rungs=naive,tutti"}));
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* key :
       {"\"rung\": \"naive\"", "\"rung\": \"tutti\"", "\"sync\": \"fsdp\"", "\"efficiency_ideal\"",
        "\"efficiency_text_only\"", "\"tokens_per_second\"", "\"spread\""}) {
    EXPECT_THAT(r.output, HasSubstr(key));
  }
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("\"sync\": \"allreduce\"")));
  const std::string png = dir + "/ladder.png";
  r = simulate(with({"--sync=allreduce", "--stages=1003520", "--plot=" + png}));
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream in(png, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG") << "no PNG at " << png;
  // A plot that cannot be drawn says why.
  r = simulate(with({"--sync=allreduce", "--stages=1003520", "--plot=" + png}),
               {"TUTTI_PYTHON=" + dir + "/no-python"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("no-python"));

  r = simulate(
      {"--fit-experiment", "--world-sizes=8", "--stages=1003520", "--steps=60", "--samples=20000"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("last steps, with the online fit"));
  EXPECT_THAT(r.output, HasSubstr("fit 1 from step"));

  // Bad inputs: each refused, naming what was wrong.
  const struct {
    std::vector<std::string> flags;
    int status;
    const char* says;
  } bad[] = {
      {with({"--model=gpt-5"}), 2, "gpt-5"},
      {with({"--cluster=tpu"}), 2, "tpu"},
      {with({"--sync=ring"}), 2, "ring"},
      {with({"--network-bandwidth=0"}), 2, "network_bandwidth is 0"},
      {with({"--nvlink-bandwidth=-5"}), 2, "nvlink_bandwidth"},
      {with({"--peak-flops=-1e15"}), 2, "peak_flops"},
      {with({"--util-llm=nan"}), 2, "util_llm"},
      {with({"--world-sizes=12"}), 2, "ranks per node"},
      {with({"--rungs=bogus"}), 2, "bogus"},
      {with({"--cluster=h100", "--sync=allreduce"}), 1, "does not fit the cluster's memory"},
      {with({"--model=vit675m-whisper-dense7b"}), 1, "no audio clips"},
      {with({"--calibration=" + dir + "/none.txt"}), 2, "none.txt"},
      {{"--ladder", "--fit-experiment"}, 2, "one of --ladder and --fit-experiment"},
      // A workload index too small for two steps of the ladder's batch.
      {with({"--index=" + index}), 2, "give a larger --index"},
  };
  for (const auto& b : bad) {
    r = simulate(b.flags);
    EXPECT_EQ(r.status, b.status) << CommandLine(b.flags) << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(b.says)) << CommandLine(b.flags);
  }
  RemoveTree(dir);
}

}  // namespace
}  // namespace tutti::e2e
