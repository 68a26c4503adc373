// Every shard file the stager opens stays beneath --source or the cache:
// staging, member reads from the cache and from the source, and the re-read
// of a member that failed its checksum, through io_uring and the thread
// pool, by openat2 and by the checked walk.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <tuple>

#include "absl/synchronization/notification.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "gtest/gtest.h"
#include "services/stager/decode/skip.h"
#include "services/stager/stager_core.h"
#include "services/stager/staging/reader.h"
#include "services/stager/staging/staging.h"
#include "services/stager/test_dataset.h"

namespace tutti::stager {
namespace {

namespace fs = std::filesystem;
using Param = std::tuple<bool, ResolveMode>;  // io_uring, resolution

std::string ParamName(const ::testing::TestParamInfo<Param>& i) {
  return std::string(std::get<0>(i.param) ? "io_uring_" : "pread_") +
         ResolveModeName(std::get<1>(i.param));
}

// A dataset in base/src, a cache in base/cache and, in base/outside, a file
// only its owner may read: a copy of shard 0's bytes (so a checksum would
// not tell it apart).
class StagerPaths : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (std::get<1>(GetParam()) == ResolveMode::kOpenat2 && !Openat2Supported()) {
      GTEST_SKIP() << "this kernel has no openat2";
    }
    base_ = ::testing::TempDir() + "/stager_paths_" + std::to_string(::getpid()) + "_" +
            ParamName({GetParam(), 0});
    fs::remove_all(base_);
    data_ = testing::WriteDataset(base_ + "/src", {.shards = 2, .samples_per_shard = 4});
    fs::create_directories(base_ + "/outside");
    secret_ = base_ + "/outside/secret.tar";
    fs::copy_file(Shard(0), secret_);
    fs::permissions(secret_, fs::perms::owner_read | fs::perms::owner_write);
    metrics_ = std::make_shared<StagerMetrics>(std::make_shared<prometheus::Registry>());
  }
  void TearDown() override {
    reader_.reset();
    read_io_.reset();
    engine_.reset();
    cache_.reset();
    fs::remove_all(base_);
  }
  std::string Shard(int i) const { return data_.dir + "/" + data_.shards[i].name(); }
  void SwapForLinkOut(int i) {
    fs::remove(Shard(i));
    fs::create_symlink(secret_, Shard(i));
  }
  void Start() {
    const ResolveMode mode = std::get<1>(GetParam());
    cache_ = std::make_unique<ShardCache>(base_ + "/cache", 0, mode);
    ASSERT_TRUE(cache_->Open().ok());
    StagingOptions o;
    o.source_dir = data_.dir;
    o.queue_depth = 4;
    o.block_size = 16384;
    o.use_io_uring = std::get<0>(GetParam());
    o.resolve = mode;
    engine_ = std::make_unique<StagingEngine>(o, cache_.get(), metrics_.get());
    ASSERT_TRUE(engine_->Start().ok());
    EXPECT_EQ(engine_->source_root().uses_openat2(), mode == ResolveMode::kOpenat2);
    std::unique_ptr<IoBackend> b =
        std::get<0>(GetParam()) ? std::move(*MakeUringBackend(16)) : MakePreadBackend(4);
    read_io_ = std::make_unique<IoService>(std::move(b));
    reader_ = std::make_unique<MemberReader>(&engine_->source_root(), cache_.get(), engine_.get(),
                                             read_io_.get(), read_io_.get(), metrics_.get());
  }
  absl::Status Stage(const v1::ShardRef& ref) {
    engine_->Request(ref, 0);
    return engine_->Wait({ref.name()}, absl::Now() + absl::Seconds(30));
  }
  absl::StatusOr<std::string> ReadMember(const v1::ShardRef& ref, bool source_only,
                                         bool* from_cache) {
    const v1::MemberRef& m = data_.samples[0].images(0);
    absl::Notification done;
    absl::StatusOr<std::string> out;
    reader_->Read(
        ref, m.name(), m.offset(), m.size(), absl::Now() + absl::Seconds(30),
        [&](absl::StatusOr<MemberReader::Bytes> bytes, bool cache) {
          out = bytes.ok() ? absl::StatusOr<std::string>(**bytes) : bytes.status();
          *from_cache = cache;
          done.Notify();
        },
        source_only);
    done.WaitForNotification();
    return out;
  }
  double Refused(const char* root, const char* reason) {
    return metrics_->PathRefused(root, reason).Value();
  }

  std::string base_, secret_;
  testing::Dataset data_;
  std::shared_ptr<StagerMetrics> metrics_;
  std::unique_ptr<ShardCache> cache_;
  std::unique_ptr<StagingEngine> engine_;
  std::unique_ptr<IoService> read_io_;
  std::unique_ptr<MemberReader> reader_;
};

TEST_P(StagerPaths, AShardSwappedForASymlinkOutAfterIndexingIsNeverStagedOrRead) {
  // Indexed (sizes and checksums known), then shard 0 is replaced by a
  // symlink to a 0600 file outside --source holding the same bytes.
  SwapForLinkOut(0);
  Start();
  absl::Status s = Stage(data_.shards[0]);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_STREQ(SkipReason(s), "outside_root");
  EXPECT_NE(s.message().find(data_.shards[0].name()), std::string::npos) << s;
  EXPECT_NE(s.message().find(data_.dir), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(cache_->PathOf(data_.shards[0].name())));
  EXPECT_FALSE(fs::exists(cache_->PartialPathOf(data_.shards[0].name())));
  EXPECT_EQ(Refused("source", "outside"), 1);
  // The sample is read from the source instead: refused the same way.
  bool from_cache = true;
  auto read = ReadMember(data_.shards[0], false, &from_cache);
  EXPECT_TRUE(absl::IsPermissionDenied(read.status())) << read.status();
  EXPECT_STREQ(SkipReason(read.status()), "outside_root");
  EXPECT_FALSE(from_cache);
  EXPECT_EQ(Refused("source", "outside"), 2);
  // The other shard stages, readable by the job's group at most.
  ASSERT_TRUE(Stage(data_.shards[1]).ok());
  struct stat st;
  ASSERT_EQ(::stat(cache_->PathOf(data_.shards[1].name()).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0137, 0u) << std::oct << st.st_mode;
}

// A FIFO put where a shard was (after indexing) is refused at once when it
// is staged and when a member is read from it, naming the shard; its open
// would otherwise wait for a writer until the deadline.
TEST_P(StagerPaths, AShardThatIsAFifoIsRefusedAtOnce) {
  fs::remove(Shard(0));
  ASSERT_EQ(::mkfifo(Shard(0).c_str(), 0600), 0);
  Start();
  absl::Status s = Stage(data_.shards[0]);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_NE(s.message().find("is not a regular file"), std::string::npos) << s;
  EXPECT_NE(s.message().find(data_.shards[0].name()), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(cache_->PathOf(data_.shards[0].name())));
  bool from_cache = true;
  auto read = ReadMember(data_.shards[0], false, &from_cache);
  EXPECT_TRUE(absl::IsNotFound(read.status())) << read.status();
  EXPECT_STREQ(SkipReason(read.status()), "missing");
  EXPECT_NE(read.status().message().find("is not a regular file"), std::string::npos)
      << read.status();
  ASSERT_TRUE(Stage(data_.shards[1]).ok());
}

TEST_P(StagerPaths, ShardsSymlinkedBeneathTheSourceStageAndRead) {
  fs::create_directories(data_.dir + "/real");
  fs::rename(Shard(0), data_.dir + "/real/0.tar");
  fs::create_symlink(fs::relative(data_.dir + "/real/0.tar", fs::path(Shard(0)).parent_path()),
                     Shard(0));  // relative
  fs::rename(Shard(1), data_.dir + "/real/1.tar");
  fs::create_symlink(data_.dir + "/real/1.tar", Shard(1));  // absolute, under --source
  Start();
  for (const v1::ShardRef& ref : data_.shards) {
    ASSERT_TRUE(Stage(ref).ok()) << ref.name();
    auto copy = ReadFileToString(cache_->PathOf(ref.name()));
    ASSERT_TRUE(copy.ok());
    EXPECT_EQ(Crc32c(*copy), ref.crc32c());
    bool from_cache = false;
    auto bytes = ReadMember(ref, /*source_only=*/true, &from_cache);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
  }
  EXPECT_EQ(Refused("source", "outside"), 0);
}

TEST_P(StagerPaths, ACachedShardSwappedForASymlinkOutIsNotRead) {
  Start();
  ASSERT_TRUE(Stage(data_.shards[0]).ok());
  fs::remove(cache_->PathOf(data_.shards[0].name()));
  fs::create_symlink(secret_, cache_->PathOf(data_.shards[0].name()));
  bool from_cache = false;
  auto read = ReadMember(data_.shards[0], false, &from_cache);
  EXPECT_TRUE(from_cache);
  EXPECT_STREQ(SkipReason(read.status()), "outside_root") << read.status();
  EXPECT_NE(read.status().message().find(cache_->dir()), std::string::npos) << read.status();
  EXPECT_EQ(Refused("cache", "outside"), 1);
}

TEST_P(StagerPaths, SymlinksPlantedInTheCacheAreNeverWrittenThrough) {
  // A symlink where the partial copy goes, and a nested shard whose cache
  // directory is a symlink out: staging refuses both, nothing outside changes.
  fs::create_directories(data_.dir + "/sub");
  fs::copy_file(Shard(1), data_.dir + "/sub/1.tar");
  v1::ShardRef nested = data_.shards[1];
  nested.set_name("sub/1.tar");
  const fs::path partial = base_ + "/cache/" + data_.shards[0].name() + ShardCache::kPartialSuffix;
  fs::create_directories(partial.parent_path());
  fs::create_symlink(secret_, partial);
  fs::create_directories(base_ + "/outside/dir");
  fs::create_symlink(base_ + "/outside/dir", base_ + "/cache/sub");
  Start();
  absl::Status s = Stage(data_.shards[0]);
  EXPECT_STREQ(SkipReason(s), "outside_root") << s;
  s = Stage(nested);
  EXPECT_STREQ(SkipReason(s), "outside_root") << s;
  EXPECT_TRUE(fs::is_empty(base_ + "/outside/dir"));
  auto secret = ReadFileToString(secret_);
  ASSERT_TRUE(secret.ok());
  EXPECT_EQ(Crc32c(*secret), data_.shards[0].crc32c());
  EXPECT_EQ(Refused("cache", "loop") + Refused("cache", "outside"), 2);
}

TEST_P(StagerPaths, NamesWithDotDotOrAbsoluteAreRefusedBeforeAnyLookup) {
  Start();
  for (const std::string name : {"../outside/secret.tar", "/etc/passwd", "a/../../x.tar"}) {
    v1::ShardRef ref = data_.shards[0];
    ref.set_name(name);
    absl::Status s = Stage(ref);
    EXPECT_STREQ(SkipReason(s), "outside_root") << name << ": " << s;
    bool from_cache = true;
    auto read = ReadMember(ref, true, &from_cache);
    EXPECT_STREQ(SkipReason(read.status()), "outside_root") << name << ": " << read.status();
  }
  EXPECT_EQ(Refused("source", "name"), 6);
}

INSTANTIATE_TEST_SUITE_P(BackendsAndModes, StagerPaths,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(ResolveMode::kOpenat2,
                                                              ResolveMode::kWalk)),
                         ParamName);

// The re-read of a member that fails its checksum in the cache goes to the
// source; a source shard swapped meanwhile for a symlink to a copy outside
// (same bytes, so the checksum would pass) is refused: the sample is
// skipped, never served from outside.
class ChecksumReread : public ::testing::TestWithParam<ResolveMode> {};

TEST_P(ChecksumReread, ReadsAgainOnlyBeneathTheSource) {
  if (GetParam() == ResolveMode::kOpenat2 && !Openat2Supported()) GTEST_SKIP() << "no openat2";
  const std::string base = ::testing::TempDir() + "/stager_paths_reread_" +
                           std::to_string(::getpid()) + ResolveModeName(GetParam());
  fs::remove_all(base);
  testing::Dataset data =
      testing::WriteDataset(base + "/src", {.shards = 1, .samples_per_shard = 12});
  v1::JobInfo job = testing::MakeJob(data, 4, 2);
  job.mutable_config()->set_job_id("pathstest-reread");
  StagerOptions o;
  o.node = 1;
  o.cache_dir = base + "/cache";
  o.staging.source_dir = data.dir;
  o.staging.queue_depth = 8;
  o.staging.block_size = 65536;
  o.staging.resolve = GetParam();
  o.decode_threads = 2;
  o.window = 2;
  o.stage_ahead = 2;
  auto metrics = std::make_shared<StagerMetrics>(std::make_shared<prometheus::Registry>());
  StagerCore core(o, metrics);
  ASSERT_TRUE(core.Start(job).ok());
  // Staged ahead of the plan, so that no batch reads the shard before the damage.
  core.staging()->Request(data.shards[0], 0);
  const std::string shard = data.dir + "/" + data.shards[0].name();
  ASSERT_TRUE(core.staging()->Wait({data.shards[0].name()}, absl::Now() + absl::Seconds(30)).ok());
  fs::create_directories(base + "/outside");
  fs::copy_file(shard, base + "/outside/copy.tar");
  fs::permissions(base + "/outside/copy.tar", fs::perms::owner_read | fs::perms::owner_write);
  fs::remove(shard);
  fs::create_symlink(base + "/outside/copy.tar", shard);
  const v1::MemberRef& m = data.samples[7].images(0);  // rank 2 has samples 6..8
  {
    std::fstream f(core.cache()->PathOf(data.shards[0].name()),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(m.offset() + 100));
    f << std::string(64, 'Z');
  }
  ASSERT_TRUE(core.AddPlan(testing::MakePlan(data, job, 0, {2, 3}, 3), 0).ok());
  int outside = 0;
  for (uint32_t r : {2u, 3u}) {
    auto d = core.Acquire(0, r, 30000);
    ASSERT_TRUE(d.ok()) << d.status();
    for (const v1::SkippedSample& s : d->skipped()) {
      EXPECT_EQ(s.reason(), "outside_root") << s.DebugString();
      EXPECT_EQ(s.sample_id(), 7u) << s.DebugString();
      outside += s.reason() == "outside_root";
    }
    ASSERT_TRUE(core.Release(0, r, {}, std::nullopt).ok());
  }
  EXPECT_EQ(outside, 1);
  EXPECT_EQ(metrics->checksum_rereads.Value(), 1);
  EXPECT_EQ(metrics->PathRefused("source", "outside").Value(), 1);
  EXPECT_EQ(metrics->SkippedSamples("outside_root").Value(), 1);
  core.Stop();
  fs::remove_all(base);
}

INSTANTIATE_TEST_SUITE_P(Modes, ChecksumReread,
                         ::testing::Values(ResolveMode::kOpenat2, ResolveMode::kWalk),
                         [](const auto& i) { return std::string(ResolveModeName(i.param)); });

}  // namespace
}  // namespace tutti::stager
