// `tutti stage` as a user runs it before a job: warms a cache directory with
// the index's shards (every byte equal to the source), keeps what is cached,
// names a shard whose bytes do not match the index, gives up on a shard
// whose source stops answering (naming it, reporting progress meanwhile)
// and finishes, refuses a cache a running daemon holds, and explains bad
// options.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e_support.h"
#include "tests/mounts.h"

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

// One shard on a source that stops answering (tutti-slowfs stalling every
// read of it), with the queue no deeper than the stalled shard could fill
// before: the other shards are staged at once, progress lines name the
// stalled shard while it is waited on, and once its reads time out the
// command finishes, exit 1, naming it. With io_uring and with pread.
TEST_F(StageCommand, AStalledShardIsGivenUpNamedAndTheRestStaged) {
#ifndef TUTTI_SLOWFS_BINARY
  GTEST_SKIP() << "built without tutti-slowfs (FUSE)";
#else
  if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "/dev/fuse is not available";
  const std::string stalled = shards_[1];
  for (const char* backend : {"uring", "pread"}) {
    SCOPED_TRACE(backend);
    const std::string mnt = dir_ + "/mnt-" + backend;
    fs::create_directories(mnt);
    auto fuse = Process::Start(
        {TUTTI_SLOWFS_BINARY, dir_ + "/ds", mnt, "--latency_ms=1", "--stall=" + stalled},
        dir_ + "/slowfs-" + backend + ".log");
    ASSERT_TRUE(fuse.ok()) << fuse.status();
    for (int i = 0; i < 250 && !mounts::Mounted(mnt) && (*fuse)->Running(); ++i) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (!mounts::Mounted(mnt)) GTEST_SKIP() << "could not mount tutti-slowfs: " << (*fuse)->log();
    const std::string cache = dir_ + "/cache-" + backend;
    RunResult r = RunCommand(
        {TuttiCli(), "stage", "--index=" + dir_ + "/index.tutti", "--source=" + mnt,
         "--cache=" + cache, "--queue-depth=4", "--block-size=64K", "--staging-timeout-ms=4000",
         "--progress-s=1", std::string("--io-backend=") + backend},
        absl::Seconds(60));
    EXPECT_FALSE(r.timed_out) << r.output;
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_LT(r.seconds, 30) << r.output;
    EXPECT_THAT(r.output, HasSubstr("waiting on " + stalled));
    EXPECT_THAT(r.output,
                HasSubstr("tutti stage: shard " + stalled + ": the source did not answer"));
    EXPECT_THAT(r.output,
                HasSubstr(absl::StrCat("staged ", shards_.size() - 1, " of ", shards_.size())));
    EXPECT_THAT(r.output, HasSubstr("1 failed (named above): " + stalled + " not staged"));
    for (const std::string& s : shards_) {
      if (s != stalled) EXPECT_EQ(Slurp(cache + "/" + s), Slurp(dir_ + "/ds/" + s)) << s;
    }
    EXPECT_FALSE(fs::exists(cache + "/" + stalled));
    (*fuse)->Signal(SIGTERM);  // unmounts (stalled reads fail with EIO)
    if (!(*fuse)->Wait(absl::Seconds(20)).has_value()) {
      RunCommand({"fusermount3", "-u", "-z", mnt}, absl::Seconds(10));
    }
  }
#endif
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
