#include "services/stager/staging/staging.h"

#include <linux/capability.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include "common/crc32c.h"
#include "common/file_io.h"
#include "gtest/gtest.h"
#include "services/stager/test_dataset.h"

namespace tutti::stager {
namespace {

namespace fs = std::filesystem;

std::string Fresh(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/staging_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

bool HasPartial(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().string().find(ShardCache::kPartialSuffix) != std::string::npos) return true;
  }
  return false;
}

struct Rig {
  testing::Dataset data;
  std::unique_ptr<ShardCache> cache;
  std::unique_ptr<StagingEngine> engine;

  Rig(const std::string& name, testing::DatasetSpec spec, std::vector<IoFault> faults = {},
      uint64_t write_limit = 0, uint64_t capacity = 0, bool uring = true) {
    const std::string root = Fresh(name);
    data = testing::WriteDataset(root + "/src", spec);
    cache = std::make_unique<ShardCache>(root + "/cache", capacity);
    EXPECT_TRUE(cache->Open().ok());
    StagingOptions o;
    o.source_dir = data.dir;
    o.queue_depth = 8;
    o.block_size = 16384;
    // Stalls are injected with a fault list and must time out quickly; without
    // one, a loaded machine must not turn slow reads into failures.
    o.op_timeout = faults.empty() ? absl::Seconds(30) : absl::Milliseconds(500);
    o.use_io_uring = uring;
    std::unique_ptr<IoBackend> backend;
    if (!faults.empty() || write_limit) {
      auto inner = MakeUringBackend(64);
      backend = std::make_unique<FaultInjectingBackend>(std::move(*inner), faults, write_limit);
    }
    engine = std::make_unique<StagingEngine>(o, cache.get(), nullptr, std::move(backend));
    EXPECT_TRUE(engine->Start().ok());
  }
  absl::Status StageAll() {
    std::vector<std::string> names;
    for (size_t i = 0; i < data.shards.size(); ++i) {
      engine->Request(data.shards[i], i);
      names.push_back(data.shards[i].name());
    }
    return engine->Wait(names, absl::Now() + absl::Seconds(20));
  }
};

class StagingBackends : public ::testing::TestWithParam<bool> {};

TEST_P(StagingBackends, CopiesVerifiesAndRenames) {
  Rig rig(GetParam() ? "uring" : "pread", {.shards = 3, .samples_per_shard = 5}, {}, 0, 0, GetParam());
  ASSERT_TRUE(rig.StageAll().ok());
  for (const auto& ref : rig.data.shards) {
    auto copy = ReadFileToString(rig.cache->PathOf(ref.name()));
    ASSERT_TRUE(copy.ok());
    EXPECT_EQ(copy->size(), ref.size());
    EXPECT_EQ(Crc32c(*copy), ref.crc32c());
    EXPECT_EQ(rig.engine->Status(ref.name()).state, ShardState::kStaged);
    // The job's group may read the cache (the access model); no one else.
    const fs::perms p = fs::status(rig.cache->PathOf(ref.name())).permissions();
    EXPECT_EQ(p & (fs::perms::others_all | fs::perms::group_write | fs::perms::group_exec),
              fs::perms::none)
        << ref.name();
  }
  EXPECT_FALSE(HasPartial(rig.cache->dir()));
  EXPECT_EQ(rig.cache->cached_files(), 3u);
}
INSTANTIATE_TEST_SUITE_P(Backends, StagingBackends, ::testing::Bool(),
                         [](const auto& i) { return i.param ? "io_uring" : "pread"; });

// What an ordinary user has: no CAP_IPC_LOCK (root's bypasses the
// locked-memory limit for io_uring) and a small `ulimit -l`.
bool BecomeMemlockLimited(rlim_t bytes) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct caps[2];
  if (::syscall(SYS_capget, &header, caps) != 0) return false;
  const unsigned bit = 1u << (CAP_IPC_LOCK % 32);
  caps[CAP_IPC_LOCK / 32].effective &= ~bit;
  caps[CAP_IPC_LOCK / 32].permitted &= ~bit;
  caps[CAP_IPC_LOCK / 32].inheritable &= ~bit;
  if (::syscall(SYS_capset, &header, caps) != 0) return false;
  struct rlimit lim{bytes, bytes};
  return ::setrlimit(RLIMIT_MEMLOCK, &lim) == 0;
}

TEST(StagingTest, BuffersBeyondTheLockedMemoryLimitFallBackToUnregistered) {
  // 16 x 64 KiB = 1 MiB of buffers against a 256 KiB limit, as 64 x 1 MiB
  // (the defaults) against the usual 8 MiB: staging still works, says why
  // it runs unregistered and how to get registered buffers.
  const std::string root = Fresh("memlock");
  auto data = testing::WriteDataset(root + "/src", {.shards = 2, .samples_per_shard = 6});
  EXPECT_EXIT(
      {
        if (!BecomeMemlockLimited(256 << 10)) ::_exit(10);
        ShardCache cache(root + "/cache", 0);
        if (!cache.Open().ok()) ::_exit(11);
        StagingOptions o;
        o.source_dir = data.dir;
        o.queue_depth = 16;
        o.block_size = 65536;
        StagingEngine engine(o, &cache, nullptr);
        if (!engine.Start().ok()) ::_exit(12);
        if (engine.registered_buffers()) ::_exit(13);
        std::vector<std::string> names;
        for (size_t i = 0; i < data.shards.size(); ++i) {
          engine.Request(data.shards[i], i);
          names.push_back(data.shards[i].name());
        }
        if (!engine.Wait(names, absl::Now() + absl::Seconds(20)).ok()) ::_exit(14);
        for (const auto& ref : data.shards) {
          auto copy = ReadFileToString(cache.PathOf(ref.name()));
          if (!copy.ok() || Crc32c(*copy) != ref.crc32c()) ::_exit(15);
        }
        engine.Stop();
        ::_exit(0);
      },
      ::testing::ExitedWithCode(0),
      "unregistered io_uring buffers.*Cannot allocate memory.*16 x 65536-byte buffers = 1024 KiB.*"
      "limit \\(ulimit -l\\) 256 KiB.*raise the limit.*--queue_depth / --block_size");
  // Within the limit the buffers are registered.
  Rig small("memlock_ok", {.shards = 1, .samples_per_shard = 2});
  EXPECT_TRUE(small.engine->registered_buffers());
}

TEST(StagingTest, MissingSourceDirectoryIsAClearError) {
  ShardCache cache(Fresh("nosrc") + "/cache", 0);
  ASSERT_TRUE(cache.Open().ok());
  StagingOptions o;
  o.source_dir = "/nonexistent/tutti-source";
  StagingEngine engine(o, &cache, nullptr);
  absl::Status s = engine.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("/nonexistent/tutti-source"), std::string::npos);
  EXPECT_NE(s.message().find("--source"), std::string::npos);
}

TEST(StagingTest, MissingShardAndBadChecksumFailWithoutCacheFiles) {
  Rig rig("bad", {.shards = 2, .samples_per_shard = 2});
  v1::ShardRef missing;
  missing.set_name("train/not-there.tar");
  v1::ShardRef bad_crc = rig.data.shards[1];
  bad_crc.set_crc32c(bad_crc.crc32c() ^ 1);
  rig.engine->Request(missing, 0);
  rig.engine->Request(bad_crc, 1);
  absl::Status a = rig.engine->Wait({missing.name()}, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(a.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(a.message().find("train/not-there.tar"), std::string::npos);
  absl::Status b = rig.engine->Wait({bad_crc.name()}, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(b.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(b.message().find("CRC-32C"), std::string::npos);
  EXPECT_FALSE(fs::exists(rig.cache->PathOf(bad_crc.name())));
  EXPECT_FALSE(HasPartial(rig.cache->dir()));
  EXPECT_EQ(rig.cache->used_bytes(), 0u);
}

TEST(StagingTest, ShardThatChangesSizeWhileStagedIsDiscarded) {
  std::string path;
  IoFault grow;
  grow.path_contains = "shard-00000";
  grow.kind = IoOp::Kind::kRead;
  grow.min_offset = 16384;
  grow.before = [&path] { std::ofstream(path, std::ios::app) << "more bytes appended by a writer"; };
  Rig rig("grow", {.shards = 1, .samples_per_shard = 6}, {grow});
  path = rig.data.dir + "/" + rig.data.shards[0].name();
  absl::Status s = rig.StageAll();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("changed while it was staged"), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(rig.cache->PathOf(rig.data.shards[0].name())));
  EXPECT_FALSE(HasPartial(rig.cache->dir()));
}

TEST(StagingTest, FullCacheDiskIsReportedAndCleanedUp) {
  Rig rig("enospc", {.shards = 1, .samples_per_shard = 6}, {}, /*write_limit=*/20000);
  absl::Status s = rig.StageAll();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("cache disk full"), std::string::npos) << s;
  EXPECT_FALSE(HasPartial(rig.cache->dir()));
  EXPECT_EQ(rig.cache->used_bytes(), 0u);
  // The cache file is allocated whole before copying: a full disk shows there.
  IoFault no_room;
  no_room.path_contains = ShardCache::kPartialSuffix;
  no_room.kind = IoOp::Kind::kFallocate;
  no_room.error = ENOSPC;
  Rig early("enospc_alloc", {.shards = 1, .samples_per_shard = 6}, {no_room});
  absl::Status e = early.StageAll();
  EXPECT_EQ(e.code(), absl::StatusCode::kResourceExhausted) << e;
  EXPECT_NE(e.message().find("cache disk full: cannot allocate"), std::string::npos) << e;
  EXPECT_NE(e.message().find("shard-00000.tar"), std::string::npos) << e;
  EXPECT_FALSE(HasPartial(early.cache->dir()));
  EXPECT_EQ(early.cache->used_bytes(), 0u);
}

TEST(StagingTest, ACacheWithRoomForOneShardStagesThemOneAtATime) {
  // Four shards asked for at once, room for one and a half: instead of every
  // shard but the first failing its reservation, each waits for the copy in
  // progress, evicts the one before it (nothing is pinned), and is staged.
  Rig probe("small_probe", {.shards = 4, .samples_per_shard = 2});
  const uint64_t size = probe.data.shards[0].size();
  Rig rig("small", {.shards = 4, .samples_per_shard = 2}, {}, 0, /*capacity=*/size + size / 2);
  std::atomic<int> staged{0};
  rig.engine->SetListener([&](const std::string&, ShardState st) {
    if (st == ShardState::kStaged) ++staged;
  });
  // Counted as they are staged: a shard evicted by the next one is not
  // staged any more by the time all four are.
  for (size_t i = 0; i < rig.data.shards.size(); ++i) rig.engine->Request(rig.data.shards[i], i);
  for (int i = 0; i < 6000 && staged.load() < 4; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(staged.load(), 4);
  EXPECT_LE(rig.cache->used_bytes(), size + size / 2);
  EXPECT_EQ(rig.cache->evictions(), 3u);
  EXPECT_FALSE(HasPartial(rig.cache->dir()));
}

TEST(StagingTest, AnEvictedShardIsNoLongerStagedAndIsStagedAgainWhenAskedFor) {
  // Two shards, room for one and a half: staging the second evicts the first.
  Rig probe("evicted_probe", {.shards = 2, .samples_per_shard = 2});
  const uint64_t size = std::max(probe.data.shards[0].size(), probe.data.shards[1].size());
  Rig rig("evicted", {.shards = 2, .samples_per_shard = 2}, {}, 0, /*capacity=*/size + size / 2);
  const auto& s = rig.data.shards;
  auto staged = [&] {
    std::set<std::string> out;
    for (const ShardStatusInfo& info : rig.engine->Snapshot()) {
      if (info.state == ShardState::kStaged) out.insert(info.name);
    }
    return out;
  };
  rig.engine->Request(s[0], 0);
  ASSERT_TRUE(rig.engine->Wait({s[0].name()}, absl::Now() + absl::Seconds(10)).ok());
  rig.engine->Request(s[1], 1);
  ASSERT_TRUE(rig.engine->Wait({s[1].name()}, absl::Now() + absl::Seconds(10)).ok());
  ASSERT_EQ(rig.cache->evictions(), 1u);
  ASSERT_FALSE(fs::exists(rig.cache->PathOf(s[0].name())));
  EXPECT_EQ(rig.engine->Status(s[0].name()).state, ShardState::kUnknown);
  EXPECT_EQ(staged(), (std::set<std::string>{s[1].name()}));

  // Asked for again (a later plan, a peer's demand): copied again, and the
  // shard it evicted in turn is the one not staged now.
  rig.engine->Request(s[0], 2);
  ASSERT_TRUE(rig.engine->Wait({s[0].name()}, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_TRUE(fs::exists(rig.cache->PathOf(s[0].name())));
  EXPECT_EQ(rig.engine->Status(s[0].name()).state, ShardState::kStaged);
  EXPECT_EQ(rig.engine->Status(s[1].name()).state, ShardState::kUnknown);
  EXPECT_EQ(staged(), (std::set<std::string>{s[0].name()}));
  EXPECT_EQ(rig.cache->evictions(), 2u);
}

TEST(StagingTest, UnreadableAndStalledSourcesFailNamingTheFile) {
  IoFault eio;
  eio.path_contains = "shard-00000";
  eio.error = EIO;
  IoFault stall;
  stall.path_contains = "shard-00001";
  stall.stall = true;
  Rig rig("eio", {.shards = 2, .samples_per_shard = 2}, {eio, stall});
  rig.engine->Request(rig.data.shards[0], 0);
  rig.engine->Request(rig.data.shards[1], 1);
  absl::Status a = rig.engine->Wait({rig.data.shards[0].name()}, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(a.code(), absl::StatusCode::kDataLoss) << a;
  EXPECT_NE(a.message().find("shard-00000"), std::string::npos);
  const absl::Time t0 = absl::Now();
  absl::Status b = rig.engine->Wait({rig.data.shards[1].name()}, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(b.code(), absl::StatusCode::kDeadlineExceeded) << b;
  EXPECT_NE(b.message().find("shard-00001"), std::string::npos);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_FALSE(HasPartial(rig.cache->dir()));
}

// A shard whose reads never return (nor can be cancelled) beside a healthy
// one: the healthy one is staged; the stalled one holds at most its bound of
// reads, fails when they time out, is tried again only after retry_after,
// then after twice that, and while its reads are still stuck a retry is
// refused at once instead of piling more reads onto the file. (Its stuck
// reads stay in the kernel for good: left out of the sanitizer run.)
TEST(StagingTest, StalledShardIsRetriedAfterADoublingWaitNeverPiledOn) {
  const std::string root = Fresh("stalled");
  auto data = testing::WriteDataset(root + "/src", {.shards = 2, .samples_per_shard = 4});
  ShardCache cache(root + "/cache", 0);
  ASSERT_TRUE(cache.Open().ok());
  StagingOptions o;
  o.source_dir = data.dir;
  o.queue_depth = 8;
  o.block_size = 4096;  // a shard is many blocks
  o.file_queue_depth = 2;
  o.op_timeout = absl::Milliseconds(300);
  o.retry_after = absl::Seconds(1);
  o.max_retry_after = absl::Seconds(2);
  IoFault stall;
  stall.path_contains = "shard-00000";
  stall.stall = true;
  stall.uncancellable = true;
  StagingEngine engine(o, &cache, nullptr,
                       std::make_unique<FaultInjectingBackend>(std::move(*MakeUringBackend(64)),
                                                               std::vector<IoFault>{stall}));
  ASSERT_TRUE(engine.Start().ok());
  const v1::ShardRef& bad = data.shards[0];
  engine.Request(bad, 0);
  engine.Request(data.shards[1], 1);
  EXPECT_TRUE(engine.Wait({data.shards[1].name()}, absl::Now() + absl::Seconds(5)).ok());
  absl::Status first = engine.Wait({bad.name()}, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(first.code(), absl::StatusCode::kDeadlineExceeded) << first;
  EXPECT_NE(first.message().find("shard " + bad.name() + ": the source did not answer"),
            std::string::npos)
      << first;
  const absl::Time failed = absl::Now();
  EXPECT_EQ(engine.Status(bad.name()).failures, 1u);
  EXPECT_EQ(engine.io_stats().stuck, 2u) << "the shard's bound";

  auto retried_by = [&](absl::Time t) {
    absl::SleepFor(t - absl::Now());
    engine.Request(bad, 0);
    return engine.Status(bad.name()).state != ShardState::kFailed;
  };
  // Asked again and again until `t`: retried once its wait has passed (a
  // loaded host may run the service's clock late, so not at one instant).
  auto retried_within = [&](absl::Time t) {
    for (;;) {
      engine.Request(bad, 0);
      if (engine.Status(bad.name()).state != ShardState::kFailed) return true;
      if (absl::Now() >= t) return false;
      absl::SleepFor(absl::Milliseconds(50));
    }
  };
  EXPECT_FALSE(retried_by(failed + absl::Milliseconds(300))) << "retried before retry_after";
  ASSERT_TRUE(retried_within(failed + absl::Seconds(5)));
  // Refused at once (kFileStalled), not after another timeout.
  absl::Status second = engine.Wait({bad.name()}, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(second.code(), absl::StatusCode::kDeadlineExceeded) << second;
  EXPECT_NE(second.message().find("got no answer in time"), std::string::npos) << second;
  EXPECT_EQ(engine.Status(bad.name()).failures, 2u);
  EXPECT_EQ(engine.io_stats().stuck, 2u) << "no read piled onto the stalled file";
  EXPECT_GE(engine.io_stats().stalled_refusals, 1u);
  const absl::Time failed2 = absl::Now();
  EXPECT_FALSE(retried_by(failed2 + absl::Milliseconds(1500))) << "the wait did not double";
  EXPECT_TRUE(retried_within(failed2 + absl::Seconds(6)));
  EXPECT_FALSE(HasPartial(cache.dir()));
}

TEST(StagingTest, EvictionIsLeastRecentlyUsedAndSparesPinnedShards) {
  // Three shards of ~equal size, room for two.
  Rig probe("lru_probe", {.shards = 3, .samples_per_shard = 2});
  const uint64_t size = probe.data.shards[0].size();
  Rig rig("lru", {.shards = 3, .samples_per_shard = 2}, {}, 0, /*capacity=*/size * 2 + size / 2);
  const auto& s = rig.data.shards;
  rig.cache->SetPinned({s[0].name()});
  rig.engine->Request(s[0], 0);
  ASSERT_TRUE(rig.engine->Wait({s[0].name()}, absl::Now() + absl::Seconds(10)).ok());
  rig.engine->Request(s[1], 1);
  ASSERT_TRUE(rig.engine->Wait({s[1].name()}, absl::Now() + absl::Seconds(10)).ok());
  rig.engine->Request(s[2], 2);  // evicts s[1] (s[0] is pinned even though older)
  ASSERT_TRUE(rig.engine->Wait({s[2].name()}, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_TRUE(fs::exists(rig.cache->PathOf(s[0].name())));
  EXPECT_FALSE(fs::exists(rig.cache->PathOf(s[1].name())));
  EXPECT_TRUE(fs::exists(rig.cache->PathOf(s[2].name())));
  EXPECT_EQ(rig.cache->evictions(), 1u);
  // Everything pinned and full: a clear error, nothing evicted.
  rig.cache->SetPinned({s[0].name(), s[2].name()});
  absl::Status full = rig.cache->Reserve(s[1].name(), size);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("--cache_capacity"), std::string::npos);
}

TEST(StagingTest, KillDuringStagingLeavesAConsistentCache) {
  const std::string root = Fresh("kill");
  auto data = testing::WriteDataset(root + "/src", {.shards = 4, .samples_per_shard = 20});
  const std::string cache_dir = root + "/cache";
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ShardCache cache(cache_dir, 0);
    if (!cache.Open().ok()) ::_exit(2);
    StagingOptions o;
    o.source_dir = data.dir;
    o.queue_depth = 2;
    o.block_size = 4096;
    o.max_files = 1;
    IoFault slow;
    slow.path_contains = "shard-0000";
    slow.delay = absl::Milliseconds(20);
    auto inner = MakeUringBackend(16);
    StagingEngine engine(o, &cache, nullptr,
                         std::make_unique<FaultInjectingBackend>(std::move(*inner), std::vector<IoFault>{slow}));
    if (!engine.Start().ok()) ::_exit(3);
    for (size_t i = 0; i < data.shards.size(); ++i) engine.Request(data.shards[i], i);
    ::sleep(60);
    ::_exit(0);
  }
  // Wait until the first shard is done and another is half written, then kill -9.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (absl::Now() < give_up &&
         !(fs::exists(cache_dir + "/" + data.shards[0].name()) && HasPartial(cache_dir))) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(fs::exists(cache_dir + "/" + data.shards[0].name()));
  ASSERT_TRUE(HasPartial(cache_dir));
  // Restart: the partial file is removed, the finished shard kept, the rest redone.
  ShardCache cache(cache_dir, 0);
  ASSERT_TRUE(cache.Open().ok());
  EXPECT_FALSE(HasPartial(cache_dir));
  EXPECT_TRUE(cache.Has(data.shards[0].name(), data.shards[0].size()));
  StagingOptions o;
  o.source_dir = data.dir;
  StagingEngine engine(o, &cache, nullptr);
  ASSERT_TRUE(engine.Start().ok());
  std::vector<std::string> names;
  for (size_t i = 0; i < data.shards.size(); ++i) {
    engine.Request(data.shards[i], i);
    names.push_back(data.shards[i].name());
  }
  ASSERT_TRUE(engine.Wait(names, absl::Now() + absl::Seconds(20)).ok());
  for (const auto& ref : data.shards) {
    auto copy = ReadFileToString(cache.PathOf(ref.name()));
    ASSERT_TRUE(copy.ok());
    EXPECT_EQ(Crc32c(*copy), ref.crc32c()) << ref.name();
  }
}

TEST(StagingTest, SecondDaemonOnTheSameCacheIsRefused) {
  const std::string dir = Fresh("lock") + "/cache";
  ShardCache a(dir, 0), b(dir, 0);
  ASSERT_TRUE(a.Open().ok());
  absl::Status s = b.Open();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("--cache"), std::string::npos);
}

}  // namespace
}  // namespace tutti::stager
