// The stager reading through tutti-slowfs (a FUSE mount that adds latency
// and stalls chosen files or byte ranges forever): the batch ships by its
// deadline with the stalled image replaced by a placeholder and counted;
// a whole shard that stops answering costs only its own samples (the other
// shards stage and serve on time, with io_uring and with pread); nothing
// hangs. Skips where FUSE is unavailable.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/stager/stager_core.h"
#include "services/stager/test_dataset.h"
#include "tests/mounts.h"

namespace tutti::stager {
namespace {

namespace fs = std::filesystem;

using ::tutti::mounts::Mounted;

// tutti-slowfs over `source` on `mnt` with the given stalls; unmounted when
// it goes.
class SlowMount {
 public:
  SlowMount(const std::string& source, const std::string& mnt,
            const std::vector<std::string>& stalls)
      : mnt_(mnt) {
    fs::create_directories(mnt);
    std::vector<std::string> args = {"tutti-slowfs", source, mnt, "--latency_ms=2"};
    for (const std::string& s : stalls) args.push_back("--stall=" + s);
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(TUTTI_SLOWFS_BINARY, argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 250 && pid_ > 0 && !Mounted(mnt); ++i) ::usleep(20000);
  }
  ~SlowMount() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
    ::system(("fusermount3 -u -q '" + mnt_ + "' 2>/dev/null").c_str());
  }
  bool mounted() const { return pid_ > 0 && Mounted(mnt_); }

 private:
  std::string mnt_;
  pid_t pid_ = -1;
};

std::string TestRoot(const std::string& name) {
  const std::string root =
      ::testing::TempDir() + "/slowfs_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(root);
  return fs::path(root).lexically_normal().string();
}

TEST(SlowfsTest, StalledImageIsSubstitutedByTheDeadline) {
  if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "/dev/fuse is not available";
  const std::string root = TestRoot("image");
  auto data = testing::WriteDataset(root + "/src", {.shards = 1, .samples_per_shard = 8});
  const std::string mnt = root + "/mnt";
  const auto& stalled = data.samples[5].images(0);
  SlowMount mount(
      data.dir, mnt,
      {absl::StrCat(data.shards[0].name(), "@", stalled.offset(), "+", stalled.size())});
  if (!mount.mounted()) GTEST_SKIP() << "could not mount tutti-slowfs on " << mnt;
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
  // The detail names the shard and the member, and says the file system did
  // not answer (it was not the stager's own queue).
  EXPECT_TRUE(absl::StrContains(
      d->skipped(0).detail(), absl::StrCat("shard ", data.shards[0].name(), " member 000005.jpg")))
      << d->skipped(0).detail();
  EXPECT_TRUE(absl::StrContains(d->skipped(0).detail(), "the file system did not answer"))
      << d->skipped(0).detail();
  EXPECT_TRUE(core.Acquire(1, 1, 20000).ok());  // samples 6, 7 from the same (unstaged) shard
  core.Stop();
}

// One shard whose every read stalls forever, beside three healthy ones,
// with the staging defaults' shape (a shard many blocks long, more than the
// queue depth): the healthy shards stage long before the per-operation
// timeout, every step of both ranks is served on time with exactly the
// stalled shard's samples skipped, timeouts are counted, and stopping does
// not wait on the stalled reads.
class StalledShardTest : public ::testing::TestWithParam<IoBackendChoice> {};

TEST_P(StalledShardTest, CostsOnlyItsOwnSamples) {
  if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "/dev/fuse is not available";
  if (GetParam() == IoBackendChoice::kUring && !ResolveIoBackend(IoBackendChoice::kUring).ok()) {
    GTEST_SKIP() << "io_uring is refused here";
  }
  const bool uring = GetParam() == IoBackendChoice::kUring;
  const std::string root = TestRoot(uring ? "shard_uring" : "shard_pread");
  auto data = testing::WriteDataset(root + "/src", {.shards = 4, .samples_per_shard = 4});
  const std::string mnt = root + "/mnt";
  const std::string stalled = data.shards[0].name();  // the first one staging asks for
  SlowMount mount(data.dir, mnt, {stalled});
  if (!mount.mounted()) GTEST_SKIP() << "could not mount tutti-slowfs on " << mnt;
  std::set<uint64_t> stalled_samples;
  for (const auto& s : data.samples) {
    if (s.shard() == 0) stalled_samples.insert(s.sample_id());
  }
  v1::JobInfo job = testing::MakeJob(data, 2, 2);
  job.mutable_config()->set_job_id(uring ? "stalled-uring" : "stalled-pread");
  StagerOptions o;
  o.io_backend = GetParam();
  o.cache_dir = root + "/cache";
  o.staging.source_dir = mnt;
  o.staging.queue_depth = 8;
  o.staging.block_size = 4096;  // each shard is more blocks than the queue depth
  o.staging.op_timeout = absl::Seconds(2);
  o.staging.retry_after = absl::Seconds(1);
  o.sample_deadline_ms = 1500;
  o.stage_wait_ms = 3000;
  o.decode_threads = 2;
  o.window = 2;
  o.stage_ahead = 2;
  auto metrics = std::make_shared<StagerMetrics>(std::make_shared<prometheus::Registry>());
  StagerCore core(o, metrics);
  ASSERT_TRUE(core.Start(job).ok());
  constexpr int kSteps = 8;
  constexpr int kPerRank = 5;  // 10 of the 16 samples a step, spread over the shards
  int next_plan = 0;
  auto add_plans = [&](int upto) {
    for (; next_plan < std::min(upto, kSteps); ++next_plan) {
      ASSERT_TRUE(core.AddPlan(testing::MakePlan(data, job, next_plan, {}, kPerRank), 0).ok());
    }
  };
  add_plans(o.window + o.stage_ahead);
  // The healthy shards are staged well within the per-operation timeout.
  std::vector<std::string> healthy;
  for (int s = 1; s < 4; ++s) healthy.push_back(data.shards[s].name());
  absl::Status staged = core.staging()->Wait(healthy, absl::Now() + absl::Seconds(1.5));
  EXPECT_TRUE(staged.ok()) << staged;

  int skipped = 0;
  for (int step = 0; step < kSteps; ++step) {
    add_plans(step + o.window + o.stage_ahead);
    for (uint32_t rank = 0; rank < 2; ++rank) {
      const absl::Time t0 = absl::Now();
      auto d = core.Acquire(step, rank, 20000);
      ASSERT_TRUE(d.ok()) << "step " << step << " rank " << rank << ": " << d.status();
      // Ready within the stage wait and one sample deadline (and some slack
      // for a loaded machine), not after the stalled reads' timeout.
      EXPECT_LT(absl::Now() - t0, absl::Seconds(8)) << "step " << step << " rank " << rank;
      std::set<uint64_t> planned;
      for (const auto& s : d->samples()) planned.insert(s.sample_id());
      std::set<uint64_t> want, got;
      for (uint64_t id : planned) {
        if (stalled_samples.count(id)) want.insert(id);
      }
      for (const auto& s : d->skipped()) {
        got.insert(s.sample_id());
        EXPECT_EQ(s.reason(), "deadline") << s.detail();
        EXPECT_TRUE(absl::StrContains(s.detail(), "shard " + stalled + " member ")) << s.detail();
        ++skipped;
      }
      EXPECT_EQ(got, want) << "step " << step << " rank " << rank << ": only the stalled shard's "
                           << "samples are skipped";
      ASSERT_TRUE(core.Release(step, rank).ok());
    }
  }
  EXPECT_GT(skipped, 0);
  EXPECT_EQ(metrics->SkippedSamples("deadline").Value(), skipped);
  // Its staging timed out (counted), and the shard is failed, named, not
  // waited on.
  EXPECT_GT(metrics->IoTimeouts("staging", "file_system").Value(), 0);
  EXPECT_GT(metrics->IoTimeouts("source", "file_system").Value(), 0);
  // Once as many of the shard's reads as its bound went unanswered, its
  // later reads are refused at once instead of each waiting the deadline.
  EXPECT_GT(metrics->IoStalledRefusals("source").Value(), 0);
  if (uring) {
    // The kernel sends FUSE reads from io_uring in the background, where no
    // cancel reaches them: they stay stuck, as many as the bound allows.
    // (The pread threads' reads are interrupted at their deadline, and
    // slowfs lets them go.)
    EXPECT_GT(metrics->IoStalledOperations("staging").Value(), 0);
    EXPECT_GT(metrics->IoStalledOperations("source").Value(), 0);
    EXPECT_LE(metrics->IoStalledOperations("source").Value(), o.source_file_reads);
  }
  const ShardStatusInfo st = core.staging()->Status(stalled);
  EXPECT_EQ(st.state, ShardState::kFailed) << ShardStateName(st.state);
  EXPECT_TRUE(absl::StrContains(st.error.message(), stalled)) << st.error;
  for (const std::string& h : healthy) {
    EXPECT_EQ(core.staging()->Status(h).state, ShardState::kStaged) << h;
  }
  const absl::Time stop = absl::Now();
  core.Stop();
  EXPECT_LT(absl::Now() - stop, absl::Seconds(3)) << "stopping waited on the stalled reads";
}

INSTANTIATE_TEST_SUITE_P(Backends, StalledShardTest,
                         ::testing::Values(IoBackendChoice::kUring, IoBackendChoice::kPread),
                         [](const auto& info) {
                           return info.param == IoBackendChoice::kUring ? "IoUring" : "Pread";
                         });

}  // namespace
}  // namespace tutti::stager
