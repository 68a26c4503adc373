// `tutti stage` as a user runs it before a job: warms a cache directory with
// the index's shards (every byte equal to the source), keeps what is cached,
// names a shard whose bytes do not match the index, refuses a cache a
// running daemon holds, and explains bad options.
#include <sys/file.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e_support.h"

namespace tutti::e2e {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string Slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

RunResult Stage(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {TuttiCli(), "stage", "--quiet"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return RunCommand(argv, absl::Seconds(60));
}

class StageCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("stage_cmd");
    ASSERT_TRUE(GenerateDataset(dir_ + "/ds").ok());
    ASSERT_TRUE(BuildIndex(dir_ + "/ds", dir_ + "/index.tutti").ok());
    for (const auto& e : fs::directory_iterator(dir_ + "/ds")) {
      if (e.path().extension() == ".tar") shards_.push_back(e.path().filename().string());
    }
    ASSERT_GE(shards_.size(), 3u);
  }
  void TearDown() override { RemoveTree(dir_); }
  std::string dir_;
  std::vector<std::string> shards_;
};

TEST_F(StageCommand, WarmsTheCacheWithEveryShardAndKeepsWhatIsCached) {
  const std::string cache = dir_ + "/cache";
  RunResult r = Stage({"--index=" + dir_ + "/index.tutti", "--cache=" + cache});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat("staged ", shards_.size(), " of ", shards_.size())));
  for (const std::string& s : shards_) {
    EXPECT_EQ(Slurp(cache + "/" + s), Slurp(dir_ + "/ds/" + s)) << s;
  }
  for (const auto& e : fs::directory_iterator(cache)) {
    EXPECT_EQ(e.path().string().find("partial"), std::string::npos) << e.path();
  }
  r = Stage({"--index=" + dir_ + "/index.tutti", "--cache=" + cache});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat("(", shards_.size(), " were cached already)")));

  // --first and --capacity bound what is taken on; nothing is evicted.
  r = Stage({"--index=" + dir_ + "/index.tutti", "--cache=" + dir_ + "/cache-first", "--first=2"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("staged 2 of 2"));
  const uint64_t one = fs::file_size(dir_ + "/ds/" + shards_[0]);
  r = Stage({"--index=" + dir_ + "/index.tutti", "--cache=" + dir_ + "/cache-small",
             absl::StrCat("--capacity=", one + one / 2)});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("left out (over --capacity)"));
}

TEST_F(StageCommand, AShardThatDoesNotMatchTheIndexIsNamedAndNotCached) {
  // Same size, other bytes: only the checksum can tell.
  const std::string bad = shards_[1];
  {
    std::fstream f(dir_ + "/ds/" + bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1000);
    f.write("XXXXXXXX", 8);
  }
  const std::string cache = dir_ + "/cache";
  RunResult r = Stage({"--index=" + dir_ + "/index.tutti", "--cache=" + cache});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr(bad));
  EXPECT_THAT(r.output, HasSubstr("1 failed"));
  EXPECT_FALSE(fs::exists(cache + "/" + bad));
  for (const auto& e : fs::directory_iterator(cache)) {
    EXPECT_EQ(e.path().string().find("partial"), std::string::npos) << e.path();
  }
  for (const std::string& s : shards_) {  // the others are staged
    if (s != bad) EXPECT_EQ(Slurp(cache + "/" + s), Slurp(dir_ + "/ds/" + s)) << s;
  }
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat("staged ", shards_.size() - 1, " of ",
                                               shards_.size())));
}

TEST_F(StageCommand, RefusesACacheADaemonHoldsAndExplainsBadOptions) {
  const std::string cache = dir_ + "/cache";
  fs::create_directories(cache);
  const int fd = ::open((cache + "/.tutti-lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  RunResult r = Stage({"--index=" + dir_ + "/index.tutti", "--cache=" + cache});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("in use by another tutti-stagerd"));
  ::close(fd);

  r = Stage({"--cache=" + cache});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--index and --cache are required"));
  r = Stage({"--index=" + dir_ + "/index.tutti", "--cache=" + cache, "--block-size=1000"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--block-size '1000' must be a multiple of 4K"));
  // Staging buffers are allocated up front, one per operation in flight.
  r = Stage({"--index=" + dir_ + "/index.tutti", "--cache=" + cache, "--queue-depth=100000"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--queue-depth 100000 is out of range: use 1..4096"));
  r = Stage({"--index=" + dir_ + "/index.tutti", "--cache=" + cache, "--queue-depth=4096",
             "--block-size=64M"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("--queue-depth 4096 x --block-size 64M is more than 4G of staging buffers"));
  r = Stage({"--index=" + dir_ + "/index.tutti", "--cache=" + cache, "--block-size=1G"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--block-size '1G' must be a multiple of 4K up to 64M"));
  r = Stage({"--index=" + dir_ + "/index.tutti", "--cache=" + cache, "--capacity=lots"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--capacity 'lots' is not a size"));
  r = Stage({"--index=" + dir_ + "/no-such.tutti", "--cache=" + cache});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("no-such.tutti"));
}

}  // namespace
}  // namespace tutti::e2e
