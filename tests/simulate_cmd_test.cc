// `tutti simulate` as a user runs it on a job config: a per-phase balance
// table (and JSON), a stop with the reason at the dataset's end, and clear
// errors for a missing config or a start past the end. And the `tutti`
// command's --version, its numeric flags' ranges and `tutti index`'s report
// of k.json fields and token ids.
#include <fstream>
#include <string>

#include "common/tar.h"
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

// `tutti simulate --egress` on a cluster small enough to count by hand: 4
// nodes of 2 ranks, 16 shards of 1 GiB (17.2 GB in all). Every node's ranks
// read every shard each step (16 a step), so today with a whole dataset's
// cache each node reads each shard once: 4 x 17.2 = 68.7 GB; with one home
// a shard and caches that hold the homes, 17.2 GB, the limit r x dataset.
// Inputs the model cannot take are refused naming the flag.
TEST(SimulateCommand, EgressPerEpochTodayAndWithHomesAndBadInputsRefused) {
  auto simulate = [&](std::vector<std::string> flags) {
    std::vector<std::string> argv = {TuttiCli(),        "simulate",           "--egress",
                                     "--nodes=4",       "--ranks-per-node=2", "--dataset-bytes=16G",
                                     "--shard-bytes=1G"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return RunCommand(argv, absl::Seconds(60));
  };
  RunResult r = simulate({"--caches=1/4,1", "--steps=20"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("W = 8 ranks on 4 nodes, 16 shards of 1.0 GiB, r = 1"));
  EXPECT_THAT(r.output, HasSubstr("counted over 20 planned steps of 4 nodes"));
  EXPECT_THAT(r.output, HasSubstr("shards a node reads a step: 16.0 today, 4.0 with homes"));
  EXPECT_THAT(r.output, HasSubstr("NFS today        NFS homes       limit rD"));
  EXPECT_THAT(r.output,
              ::testing::ContainsRegex("\n1 +17.2 GB +68.7 GB +17.2 GB +17.2 GB +4.0 +1.000\n"));
  EXPECT_THAT(r.output, ::testing::ContainsRegex("\n0.25 +4.3 GB +[0-9.]+ [GT]B +17.2 GB "
                                                 "+17.2 GB +[0-9.]+ +1.000\n"));

  r = simulate({"--caches=1", "--replication=2", "--steps=10", "--json"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\"replication\":2"));
  EXPECT_THAT(r.output, HasSubstr("\"counted_steps\":10"));
  EXPECT_THAT(r.output, HasSubstr("\"nfs_today_bytes\":6.87195e+10"));
  EXPECT_THAT(r.output, HasSubstr("\"nfs_locality_bytes\":3.43597e+10"));
  EXPECT_THAT(r.output, HasSubstr("\"limit_bytes\":3.43597e+10"));

  struct Case {
    std::string flag;
    const char* expect;
  };
  for (const Case& c : {
           Case{"--nodes=0", "--nodes 0 is out of range"},
           Case{"--caches=nan", "cache size 'nan' is not a fraction of the dataset in (0, 1]"},
           Case{"--caches=2", "cache size '2' is not a fraction of the dataset in (0, 1]"},
           Case{"--caches=17G", "is larger than the dataset"},
           Case{"--caches=0", "cache size '0' is not a fraction"},
           Case{"--dataset-bytes=nan", "--dataset-bytes 'nan' is not a size"},
           Case{"--shard-bytes=0", "--shard-bytes '0' is not a size"},
           Case{"--replication=5", "replication 5 is not in 1..4 (the nodes)"},
       }) {
    r = simulate({c.flag, "--steps=2"});
    EXPECT_EQ(r.status, 2) << c.flag << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.expect)) << c.flag;
  }
  // Caches too small for the homes: today's egress still, the homes refused.
  r = simulate({"--caches=1/8,1/2", "--replication=4", "--steps=2"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("no cache size given holds the homes"));
  r = simulate({"--caches=1/8,1", "--replication=4", "--steps=2"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("homes refused: 4 copies of the dataset need 68.7 GB but 4 "
                                  "nodes' caches of 2.1 GB hold 8.6 GB; raise the cache"));
}

// `tutti --version` as every tutti binary takes it; numeric flags outside
// their range and a job config value outside its range are refused naming
// the range before anything is sized by them.
TEST(TuttiCommand, VersionAndOutOfRangeValuesNameTheRange) {
  for (const char* form : {"--version", "version"}) {
    RunResult r = RunCommand({TuttiCli(), form}, absl::Seconds(30));
    EXPECT_EQ(r.status, 0) << form << "\n" << r.output;
    EXPECT_THAT(r.output, ::testing::MatchesRegex("tutti [0-9.]+ \\(commit [^,]+, wire contract "
                                                  "tutti.v1\\)\n"))
        << form;
  }
  for (const char* daemon : {Packerd(), Stagerd()}) {
    RunResult r = RunCommand({daemon, "--version"}, absl::Seconds(30));
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("(commit ")) << daemon;
  }

  const std::string dir = MakeTempDir("tutti_cmd");
  struct Case {
    std::vector<std::string> argv;
    const char* expect;
  };
  for (const Case& c : {
           Case{{"index", "--out=" + dir + "/i", "--threads=4000000000"},
                "--threads 4000000000 is out of range: use 1..256"},
           Case{{"index", "--out=" + dir + "/i", "--synthetic=5000000000"},
                "--synthetic 5000000000 is out of range: use 0..4294967295"},
           Case{{"plan", "--config=x", "--steps=0"}, "--steps 0 is out of range: use 1..1000000"},
           Case{{"simulate", "--config=x", "--steps=100000000"},
                "--steps 100000000 is out of range: use 1..1000000"},
       }) {
    std::vector<std::string> argv = {TuttiCli()};
    argv.insert(argv.end(), c.argv.begin(), c.argv.end());
    RunResult r = RunCommand(argv, absl::Seconds(30));
    EXPECT_EQ(r.status, 2) << c.expect << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.expect));
  }
  RunResult g = RunCommand({TuttiCli(), "gen-dataset", "--out=" + dir + "/ds", "--threads=100000"},
                           absl::Seconds(30));
  EXPECT_NE(g.status, 0) << g.output;
  EXPECT_THAT(g.output, HasSubstr("--threads must be in [0, 1024], got 100000"));

  // A job config value the plans are sized by: refused at load, at once.
  ASSERT_EQ(RunCommand({TuttiCli(), "index", "--synthetic=2000", "--out=" + dir + "/index.tutti"},
                       absl::Seconds(60))
                .status,
            0);
  const std::string job = dir + "/huge.textproto";
  std::ofstream(job) << "world_size: 4 ranks_per_node: 2\n"
                        "batch { text_samples_per_step: 8 vl_samples_per_step: 4 "
                        "vl_micro_batch: 2147483647 }\n";
  RunResult p =
      RunCommand({TuttiCli(), "plan", "--config=" + job, "--index=" + dir + "/index.tutti"},
                 absl::Seconds(60));
  EXPECT_EQ(p.status, 1) << p.output;
  EXPECT_THAT(p.output, HasSubstr("batch.vl_micro_batch 2147483647 is outside its range 1..1024"));
  RemoveTree(dir);
}

// `tutti index` says which k.json fields it does not know (counted, the
// first few named) and refuses token ids beyond the vocabulary by default,
// naming the sample and the flag.
TEST(TuttiCommand, IndexNamesUnknownJsonFieldsAndTheVocabulary) {
  const std::string dir = MakeTempDir("tutti_index_cmd");
  TarWriter t;
  t.Add("a.json", R"({"input_ids": [1, 2], "url": "http://x"})");
  t.Add("b.json", R"({"input_id": [1, 2], "text": "abcdefgh", "url": "http://y"})");
  t.Add("c.json", R"({"input_ids": [1, 200000]})");
  t.Add("d.json", R"({"input_ids":[1,2],"meta":{"id":"7"},"schema":2,"source":"x",)"
                  R"("trained":[[0,2]]})");
  std::ofstream(dir + "/s.tar", std::ios::binary) << t.Finish();
  RunResult r = RunCommand(
      {TuttiCli(), "index", "--source=" + dir, "--out=" + dir + "/index.tutti"}, absl::Seconds(60));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("warning: 2 k.json members carry fields tutti does not know, "
                                  "ignored: \"input_id\" (1), \"url\" (2)"));
  EXPECT_THAT(r.output, HasSubstr("s.tar:c: c.json: input_ids[1] is 200000, outside the "
                                  "vocabulary [0, 151936) (--vocab-size)"));
  EXPECT_THAT(r.output, HasSubstr("1 sample holds token ids at or above --vocab-size 151936 (the "
                                  "default, Qwen2-VL's)"));
  r = RunCommand({TuttiCli(), "index", "--source=" + dir, "--out=" + dir + "/index.tutti",
                  "--vocab-size=262144"},
                 absl::Seconds(60));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("4 samples"));
  r = RunCommand(
      {TuttiCli(), "index", "--source=" + dir, "--out=" + dir + "/index.tutti", "--vocab-size=0"},
      absl::Seconds(60));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--vocab-size 0 is out of range: use 1..2147483648"));
  RemoveTree(dir);
}

}  // namespace
}  // namespace tutti::e2e
