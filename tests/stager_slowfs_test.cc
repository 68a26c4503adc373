// The stager reading through tutti-slowfs (a FUSE mount that adds latency
// and stalls one image forever): the batch ships by its deadline with the
// stalled image replaced by a placeholder and counted; nothing hangs. Skips where FUSE is
// unavailable.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/stager/stager_core.h"
#include "services/stager/test_dataset.h"
#include "tests/mounts.h"

namespace tutti::stager {
namespace {

namespace fs = std::filesystem;

using ::tutti::mounts::Mounted;

TEST(SlowfsTest, StalledImageIsSubstitutedByTheDeadline) {
  if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "/dev/fuse is not available";
  const std::string root = ::testing::TempDir() + "/slowfs_" + std::to_string(::getpid());
  fs::remove_all(root);
  auto data = testing::WriteDataset(root + "/src", {.shards = 1, .samples_per_shard = 8});
  const std::string mnt = fs::path(root + "/mnt").lexically_normal().string();
  fs::create_directories(mnt);
  const auto& stalled = data.samples[5].images(0);
  const std::string stall = absl::StrCat("--stall=", data.shards[0].name(), "@", stalled.offset(), "+",
                                         stalled.size());
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execl(TUTTI_SLOWFS_BINARY, "tutti-slowfs", data.dir.c_str(), mnt.c_str(), "--latency_ms=2",
            stall.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 250 && !Mounted(mnt); ++i) ::usleep(20000);
  if (!Mounted(mnt)) {
    ::kill(pid, SIGTERM);
    ::waitpid(pid, nullptr, 0);
    GTEST_SKIP() << "could not mount tutti-slowfs on " << mnt;
  }
  {
    v1::JobInfo job = testing::MakeJob(data, 2, 2);
    job.mutable_config()->set_job_id("slowfs");
    StagerOptions o;
    o.cache_dir = root + "/cache";
    o.staging.source_dir = mnt;
    o.staging.queue_depth = 4;
    o.staging.block_size = 65536;
    o.staging.op_timeout = absl::Milliseconds(500);
    o.sample_deadline_ms = 500;
    o.stage_wait_ms = 100;
    o.decode_threads = 1;
    o.window = 2;
    StagerCore core(o, nullptr);
    ASSERT_TRUE(core.Start(job).ok());
    // A batch that does not touch sample 5 first.
    ASSERT_TRUE(core.AddPlan(testing::MakePlan(data, job, 0, {}, 2), 0).ok());  // samples 0..3
    ASSERT_TRUE(core.AddPlan(testing::MakePlan(data, job, 1, {}, 2), 0).ok());  // samples 4..7
    ASSERT_TRUE(core.Acquire(0, 0, 20000).ok());
    const absl::Time t0 = absl::Now();
    auto d = core.Acquire(1, 0, 20000);  // samples 4, 5
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
    ASSERT_EQ(d->skipped_size(), 1);
    EXPECT_EQ(d->skipped(0).sample_id(), 5u);
    EXPECT_EQ(d->skipped(0).reason(), "deadline");
    EXPECT_EQ(d->skipped(0).substitute_id(), 0u);
    EXPECT_EQ(d->skipped(0).action(), "placeholder");
    EXPECT_TRUE(core.Acquire(1, 1, 20000).ok());  // samples 6, 7 from the same (unstaged) shard
    core.Stop();
  }
  ::kill(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
  ::system(("fusermount3 -u -q '" + mnt + "' 2>/dev/null").c_str());
}

}  // namespace
}  // namespace tutti::stager
