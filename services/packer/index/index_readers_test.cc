// The readers of `tutti index` give the same index: the read-ahead reader
// with many reads in flight over many shards at once, the same reader with
// one read in flight, and the reader that reads every header where it lies,
// over io_uring and the pread pool, into memory or through a file.
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/uring_file.h"
#include "gtest/gtest.h"
#include "services/packer/index/index.h"
#include "services/packer/index/index_builder.h"
#include "services/packer/index/shard_test_util.h"

namespace tutti::packer {
namespace {

using testing::MixedShard;
using testing::TempDir;

struct Reader {
  const char* name;
  ShardReader reader;
  uint32_t threads;
  uint32_t io_depth;
  uint64_t read_bytes;
  IoBackendChoice backend;
};

TEST(IndexReadersTest, EveryReaderGivesTheSameIndex) {
  TempDir dir;
  dir.Write("a/000.tar", MixedShard(0, 40));
  dir.Write("a/001.tar", MixedShard(40, 31));
  const std::string cut = MixedShard(71, 20);
  dir.Write("b/002.tar", cut.substr(0, cut.size() / 2 + 100));  // truncated: left out
  dir.Write("b/003.tar", std::string(3000, 'j'));               // not a tar
  dir.Write("c/004.tar", "");                                   // empty
  dir.Write("c/005.tar", MixedShard(100, 9));
  dir.Write("c/006.tar", MixedShard(200, 1));

  const bool uring = ResolveIoBackend(IoBackendChoice::kUring).ok();
  const IoBackendChoice fast = uring ? IoBackendChoice::kUring : IoBackendChoice::kPread;
  const Reader readers[] = {
      {"per-header, one at a time", ShardReader::kPerHeader, 1, 1, 1 << 20,
       IoBackendChoice::kPread},
      {"read-ahead, one read in flight", ShardReader::kReadAhead, 1, 1, 1 << 20, fast},
      {"read-ahead, 4 KiB reads, 4 x 4 in flight", ShardReader::kReadAhead, 4, 4, 4096,
       IoBackendChoice::kPread},
      {"read-ahead, 64 KiB reads, 3 x 16 in flight", ShardReader::kReadAhead, 3, 16, 64 << 10,
       fast},
      {"per-header, 5 shards at once", ShardReader::kPerHeader, 5, 1, 1 << 20, fast},
  };
  std::string first;
  IndexBuildReport first_report;
  for (const Reader& r : readers) {
    SCOPED_TRACE(r.name);
    IndexBuildOptions o;
    o.source_dir = dir.path();
    o.reader = r.reader;
    o.threads = r.threads;
    o.io_depth = r.io_depth;
    o.read_bytes = r.read_bytes;
    o.io_backend = r.backend;
    IndexBuildReport report;
    auto bytes = BuildIndex(o, &report, nullptr);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    if (first.empty()) {
      first = *bytes;
      first_report = report;
      // The dataset reaches what the readers must agree on.
      auto ix = Index::FromString(first, "first.idx");
      ASSERT_TRUE(ix.ok()) << ix.status();
      EXPECT_EQ((*ix)->num_shards(), 4u);
      EXPECT_EQ(report.bad_shards.size(), 3u);
      EXPECT_GT(report.skipped["bad_image_header"], 0u);
      EXPECT_GT(report.skipped["duplicate_member"], 0u);
      EXPECT_GT(report.images, 0u);
      EXPECT_GT(report.audio, 0u);
      continue;
    }
    EXPECT_TRUE(*bytes == first) << "the index differs";
    EXPECT_EQ(report.samples, first_report.samples);
    EXPECT_EQ(report.skipped, first_report.skipped);
    EXPECT_EQ(report.skipped_members, first_report.skipped_members);
    EXPECT_EQ(report.ignored_members, first_report.ignored_members);
    EXPECT_EQ(report.bad_shards, first_report.bad_shards);
    EXPECT_EQ(report.skipped_examples, first_report.skipped_examples);
  }
  // Written through the columns' temporary files: the same bytes.
  IndexBuildOptions o;
  o.source_dir = dir.path();
  const std::string out = dir.path() + "/out/index.tutti";
  std::filesystem::create_directories(dir.path() + "/out");
  ASSERT_TRUE(BuildIndexFile(o, out, nullptr, nullptr).ok());
  auto file = ReadFileToString(out);
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE(*file == first);
}

}  // namespace
}  // namespace tutti::packer
