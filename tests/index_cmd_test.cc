// `tutti index` as a user runs it again over a dataset that grew: it reuses
// the index at --out for the shards that did not change, and writes the same
// file a full build writes; --full reads everything; --append refuses what
// would renumber samples; an index of the old format at --out is rebuilt.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e_support.h"

namespace tutti::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

RunResult Index(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {TuttiCli(), "index"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return RunCommand(argv, absl::Seconds(120));
}

TEST(IndexCommand, RerunReadsOnlyNewShardsAndWritesWhatAFullRunWrites) {
  const std::string dir = MakeTempDir("index_cmd");
  const std::string ds = dir + "/ds", out = dir + "/index.tutti", full = dir + "/full.tutti";
  ASSERT_TRUE(GenerateDataset(ds).ok());
  RunResult r = Index({"--source=" + ds, "--out=" + out});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("indexed 3 of 3 shards"));
  EXPECT_THAT(r.output, Not(HasSubstr("reused")));

  // Nothing changed: nothing read.
  r = Index({"--source=" + ds, "--out=" + out});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("reused 3 unchanged shards from " + out + ", read 0 new"));

  // A shard added at the end: --append reads it alone; the file is the full build's.
  std::filesystem::copy_file(ds + "/shard-000001.tar", ds + "/shard-000009.tar");
  r = Index({"--source=" + ds, "--out=" + out, "--append"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("reused 3 unchanged shards from " + out + ", read 1 new"));
  r = Index({"--source=" + ds, "--out=" + full});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(ReadFileOrEmpty(out), ReadFileOrEmpty(full));

  // One among the indexed ones: --append refuses, naming it; a plain rerun takes it.
  std::filesystem::copy_file(ds + "/shard-000001.tar", ds + "/shard-000001b.tar");
  r = Index({"--source=" + ds, "--out=" + out, "--append"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("shard-000001b.tar sorts before shard-000009.tar"));
  r = Index({"--source=" + ds, "--out=" + out});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("reused 4 unchanged shards from " + out + ", read 1 new"));
  r = Index({"--source=" + ds, "--out=" + full, "--full"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("reused")));
  EXPECT_EQ(ReadFileOrEmpty(out), ReadFileOrEmpty(full));

  // An index of another format at --out: said so, and every shard read.
  std::ofstream(out, std::ios::binary | std::ios::trunc)
      << std::string("TUTTIIDX\x01\0\0\0", 12) << std::string(52, '\0');
  r = Index({"--source=" + ds, "--out=" + out});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("not reusing " + out));
  EXPECT_THAT(r.output, HasSubstr("format version 1"));
  EXPECT_EQ(ReadFileOrEmpty(out), ReadFileOrEmpty(full));
  RemoveTree(dir);
}

// The benchmark runs its readers, finds them agreeing, and loads an index
// (small sizes: this checks the command, not the speed).
TEST(IndexCommand, BenchIndexComparesTheReadersAndLoadsAnIndex) {
  const std::string dir = MakeTempDir("bench_index");
  RunResult r = RunCommand(
      {TuttiCli(), "bench", "index", "--dir=" + dir, "--samples=30", "--samples_per_shard=10",
       "--max_megapixels=0.1", "--rounds=1", "--skip_slowfs", "--load_samples=20000", "--json"},
      absl::Seconds(240));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\"reader\": \"per-header, 1 shard, 1 read in flight each\""));
  EXPECT_THAT(r.output, HasSubstr("\"samples\": 30,"));
  EXPECT_THAT(r.output, Not(HasSubstr("\"same_index\": false")));
  EXPECT_THAT(r.output, HasSubstr("\"case\": \"index_load\", \"cache\": \"cold\", \"ok\": true, "
                                  "\"samples\": 20000"));
  r = RunCommand({TuttiCli(), "bench", "index", "--threads=0"}, absl::Seconds(30));
  EXPECT_EQ(r.status, 2) << r.output;
  RemoveTree(dir);
}

}  // namespace
}  // namespace tutti::e2e
