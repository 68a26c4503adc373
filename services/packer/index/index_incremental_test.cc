// An incremental `tutti index` (the previous index reused for every shard
// that did not change) writes the same bytes as a full one: after a shard
// is added, changed, removed, fixed, or left as it was.
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/packer/index/index.h"
#include "services/packer/index/index_builder.h"
#include "services/packer/index/shard_test_util.h"

namespace tutti::packer {
namespace {

using ::testing::HasSubstr;
using testing::MixedShard;
using testing::TempDir;

class IncrementalIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 4; ++i) WriteShard(i, MixedShard(i * 100, 20 + i));
    out_ = dir_.path() + "-index.tutti";
    Rebuild();
  }
  void TearDown() override { ::unlink(out_.c_str()); }

  std::string Shard(int i) const { return absl::StrCat("shard-", 100 + i * 10, ".tar"); }
  void WriteShard(int i, const std::string& data, int64_t mtime = 1'700'000'000) {
    dir_.Write(Shard(i), data);
    dir_.Touch(Shard(i), mtime + i);
  }

  IndexBuildOptions Options() const {
    IndexBuildOptions o;
    o.source_dir = dir_.path();
    o.threads = 3;
    o.io_depth = 4;
    o.read_bytes = 16 << 10;
    return o;
  }
  // A full build into the file the next incremental build starts from.
  void Rebuild() {
    ASSERT_TRUE(BuildIndexFile(Options(), out_, nullptr, nullptr).ok());
    auto prev = LoadIndex(out_);
    ASSERT_TRUE(prev.ok()) << prev.status();
    prev_ = *prev;
  }
  // Full and incremental builds of the source as it is now: equal bytes,
  // and the incremental one read `reads` shards.
  void ExpectSameAsFull(uint32_t reads, uint32_t removed = 0) {
    IndexBuildReport full_report, inc_report;
    auto full = BuildIndex(Options(), &full_report, nullptr);
    ASSERT_TRUE(full.ok()) << full.status();
    IndexBuildOptions o = Options();
    o.previous = prev_;
    auto inc = BuildIndex(o, &inc_report, nullptr);
    ASSERT_TRUE(inc.ok()) << inc.status();
    EXPECT_TRUE(*inc == *full) << "the incremental index differs from the full one";
    EXPECT_EQ(inc_report.not_incremental, "");
    EXPECT_EQ(inc_report.shards_read, reads);
    EXPECT_EQ(inc_report.shards_removed, removed);
    EXPECT_EQ(inc_report.shards_reused + inc_report.shards_read, full_report.shards_read);
    EXPECT_EQ(inc_report.samples, full_report.samples);
    EXPECT_EQ(inc_report.skipped, full_report.skipped);
    EXPECT_EQ(inc_report.bad_shards, full_report.bad_shards);
    // Through the file, over the mapped previous index it replaces.
    o.threads = 1;
    ASSERT_TRUE(BuildIndexFile(o, out_, nullptr, nullptr).ok());
    auto file = ReadFileToString(out_);
    ASSERT_TRUE(file.ok());
    EXPECT_TRUE(*file == *full) << "the index file differs from the full index";
  }

  TempDir dir_;
  std::string out_;
  std::shared_ptr<const Index> prev_;
};

TEST_F(IncrementalIndexTest, NothingChangedNothingRead) { ExpectSameAsFull(0); }

TEST_F(IncrementalIndexTest, ANewShardIsTheOnlyOneRead) {
  dir_.Write("shard-999.tar", MixedShard(900, 11));  // sorts last
  ExpectSameAsFull(1);
  Rebuild();
  dir_.Write("shard-105.tar", MixedShard(700, 5));  // sorts among the others
  ExpectSameAsFull(1);
}

TEST_F(IncrementalIndexTest, AChangedShardIsReadAgain) {
  WriteShard(1, MixedShard(500, 17), 1'800'000'000);
  ExpectSameAsFull(1);
  // The same size, another modification time: read again all the same.
  Rebuild();
  dir_.Touch(Shard(2), 1'900'000'000);
  ExpectSameAsFull(1);
}

TEST_F(IncrementalIndexTest, ARemovedShardIsDropped) {
  std::filesystem::remove(dir_.path() + "/" + Shard(2));
  ExpectSameAsFull(0, 1);
}

TEST_F(IncrementalIndexTest, ABadShardStaysOutUnreadUntilItChanges) {
  const std::string good = MixedShard(300, 8);
  WriteShard(3, good.substr(0, good.size() / 2 + 100));  // truncated
  Rebuild();
  ASSERT_EQ(prev_->bad_shards().size(), 1u);
  EXPECT_EQ(prev_->bad_shards()[0].name, Shard(3));
  EXPECT_THAT(prev_->bad_shards()[0].why, HasSubstr("truncated"));
  ExpectSameAsFull(0);
  WriteShard(3, good, 1'800'000'000);  // re-copied
  ExpectSameAsFull(1);
}

TEST_F(IncrementalIndexTest, OtherOptionsReadEveryShard) {
  IndexBuildOptions o = Options();
  o.previous = prev_;
  o.max_images_per_sample = 1;
  IndexBuildReport report;
  auto inc = BuildIndex(o, &report, nullptr);
  ASSERT_TRUE(inc.ok()) << inc.status();
  EXPECT_THAT(report.not_incremental, HasSubstr("other options"));
  EXPECT_EQ(report.shards_read, 4u);
  o.previous = nullptr;
  auto full = BuildIndex(o, nullptr, nullptr);
  ASSERT_TRUE(full.ok());
  EXPECT_TRUE(*inc == *full);
}

TEST_F(IncrementalIndexTest, AppendAddsShardsOrRefusesToRenumber) {
  IndexBuildOptions o = Options();
  o.previous = prev_;
  o.append = true;
  dir_.Write("shard-999.tar", MixedShard(900, 11));
  IndexBuildReport report;
  auto appended = BuildIndex(o, &report, nullptr);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(report.shards_read, 1u);
  auto full = BuildIndex(Options(), nullptr, nullptr);
  ASSERT_TRUE(full.ok());
  EXPECT_TRUE(*appended == *full);

  dir_.Write("shard-105.tar", MixedShard(700, 5));  // among the indexed ones
  auto middle = BuildIndex(o, nullptr, nullptr);
  ASSERT_FALSE(middle.ok());
  EXPECT_EQ(middle.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(middle.status().message()), HasSubstr("shard-105.tar"));
  EXPECT_THAT(std::string(middle.status().message()), HasSubstr("without --append"));
  std::filesystem::remove(dir_.path() + "/shard-105.tar");

  dir_.Touch(Shard(0), 1'900'000'000);
  auto changed = BuildIndex(o, nullptr, nullptr);
  ASSERT_FALSE(changed.ok());
  EXPECT_THAT(std::string(changed.status().message()), HasSubstr(Shard(0) + " changed"));
  dir_.Touch(Shard(0), 1'700'000'000);

  std::filesystem::remove(dir_.path() + "/" + Shard(1));
  auto removed = BuildIndex(o, nullptr, nullptr);
  ASSERT_FALSE(removed.ok());
  EXPECT_THAT(std::string(removed.status().message()), HasSubstr(Shard(1) + " is in the index"));

  o.previous = nullptr;
  auto none = BuildIndex(o, nullptr, nullptr);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("there is none"));
}

}  // namespace
}  // namespace tutti::packer
