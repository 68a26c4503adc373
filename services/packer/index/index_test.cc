#include "services/packer/index/index.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "common/heap_usage.h"
#include "gtest/gtest.h"
#include "services/packer/bench/synthetic.h"
#include "services/packer/index/index_format.h"

namespace tutti::packer {
namespace {

std::string SmallIndex() {
  IndexWriter w;
  w.SetSourceDir("/data/set");
  w.AddMeta("builder", "test");
  EXPECT_TRUE(w.AddShard("a/000.tar", 100000, 0xabcdef01).ok());
  MemberInput json{MemberKind::kJson, "json", 512, 40};
  EXPECT_TRUE(w.AddSample("k0", 12, &json, {}).ok());
  MemberInput img{MemberKind::kPng, "0.png", 2048, 900, 640, 480};
  MemberInput img2{MemberKind::kWebp, "1.webp", 4096, 500, 65535, 28};
  MemberInput wav{MemberKind::kWav, "wav", 8192, 1000, 0, 0, 2500};
  EXPECT_TRUE(w.AddSample("k1", 5, &json, {img, img2, wav}).ok());
  EXPECT_TRUE(w.AddShard("b/001.tar", 50000, 7).ok());
  MemberInput txt{MemberKind::kTxt, "txt", 600, 4000};
  EXPECT_TRUE(w.AddSample("longer/key-2", 1000, &txt, {}).ok());
  EXPECT_TRUE(w.AddSample("k3", 0, nullptr, {img}).ok());
  return w.Finish();
}

// ShardOf against the shard table, for shards of 0 to 2,000 samples (a
// bucket of ShardOf's lookup holding many shards, one, or part of one) and
// empty shards in between.
TEST(IndexTest, ShardOfFollowsTheShardTable) {
  IndexWriter w;
  MemberInput json{MemberKind::kJson, "json", 0, 10};
  const uint32_t sizes[] = {3, 0, 1, 1, 700, 0, 0, 2000, 1, 257, 256, 255, 0, 5, 1000, 2};
  uint32_t n = 0;
  for (uint32_t sh = 0; sh < 16; ++sh) {
    ASSERT_TRUE(w.AddShard(absl::StrCat("s/", sh, ".tar"), 1 << 20, 0).ok());
    for (uint32_t k = 0; k < sizes[sh]; ++k, ++n) {
      ASSERT_TRUE(w.AddSample(absl::StrCat("k", n), 1, &json, {}).ok());
    }
  }
  auto index = Index::FromString(w.Finish(), "mem.idx");
  ASSERT_TRUE(index.ok()) << index.status();
  const Index& ix = **index;
  ASSERT_EQ(ix.num_samples(), n);
  uint32_t shard = 0;
  for (uint32_t s = 0; s < n; ++s) {
    while (shard + 1 < ix.num_shards() && ix.shard(shard + 1).first_sample <= s) ++shard;
    ASSERT_EQ(ix.ShardOf(s), shard) << "sample " << s;
    ASSERT_GT(ix.shard(shard).num_samples, 0u);
  }
}

TEST(IndexTest, RoundTrip) {
  auto index = Index::FromString(SmallIndex(), "mem.idx");
  ASSERT_TRUE(index.ok()) << index.status();
  const Index& ix = **index;
  ASSERT_EQ(ix.num_samples(), 4u);
  ASSERT_EQ(ix.num_shards(), 2u);
  EXPECT_EQ(ix.source_dir(), "/data/set");
  EXPECT_EQ(ix.shard(0).name, "a/000.tar");
  EXPECT_EQ(ix.shard(0).crc32c, 0xabcdef01u);
  EXPECT_EQ(ix.shard(1).size, 50000u);
  EXPECT_EQ(ix.dataset_bytes(), 150000u);
  EXPECT_EQ(ix.ShardOf(0), 0u);
  EXPECT_EQ(ix.ShardOf(1), 0u);
  EXPECT_EQ(ix.ShardOf(2), 1u);
  EXPECT_EQ(ix.key(2), "longer/key-2");
  EXPECT_EQ(ix.text_kind(2), MemberKind::kTxt);
  EXPECT_EQ(ix.text_tokens(2), 1000u);
  EXPECT_EQ(ix.MemberName(2, ix.text_ext(2)), "longer/key-2.txt");
  EXPECT_EQ(ix.text_kind(3), MemberKind::kNone);
  ASSERT_EQ(ix.media_end(1) - ix.media_begin(1), 3u);
  const MediaView a = ix.media(ix.media_begin(1));
  EXPECT_EQ(a.kind, MemberKind::kPng);
  EXPECT_EQ(a.width, 640u);
  EXPECT_EQ(a.height, 480u);
  EXPECT_EQ(a.offset, 2048u);
  EXPECT_EQ(ix.MemberName(1, a.ext), "k1.0.png");
  const MediaView b = ix.media(ix.media_begin(1) + 1);
  EXPECT_EQ(b.width, 65535u);
  EXPECT_EQ(b.height, 28u);
  const MediaView c = ix.media(ix.media_begin(1) + 2);
  EXPECT_EQ(c.kind, MemberKind::kWav);
  EXPECT_EQ(c.audio_ms, 2500u);
  EXPECT_EQ(ix.text_samples(), (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(ix.vl_samples(), (std::vector<uint32_t>{1, 3}));
}

TEST(IndexTest, EveryFlippedByteIsRefused) {
  const std::string good = SmallIndex();
  // Flip one byte at a time across the whole file: never accepted, never a crash.
  for (size_t i = 0; i < good.size(); i += 7) {
    std::string bad = good;
    bad[i] ^= 0x5A;
    auto index = Index::FromString(bad, "bad.idx");
    EXPECT_FALSE(index.ok()) << "byte " << i;
    if (!index.ok()) {
      EXPECT_NE(index.status().message().find("bad.idx"), std::string::npos) << index.status();
    }
  }
}

// Rewrites every copy of `from` with `to` (same length) and fixes every
// checksum, as a tool writing a damaged index on purpose would.
std::string ResealedWith(std::string bytes, const std::string& from, const std::string& to) {
  for (size_t at; (at = bytes.find(from)) != std::string::npos;) bytes.replace(at, from.size(), to);
  char* p = bytes.data();
  uint32_t sections;
  std::memcpy(&sections, p + 12, 4);
  for (uint32_t i = 0; i < sections; ++i) {
    char* e = p + 64 + i * 32;
    uint64_t off, n;
    std::memcpy(&off, e + 8, 8);
    std::memcpy(&n, e + 16, 8);
    const uint32_t crc = Crc32cExtend(0, p + off, n);
    std::memcpy(e + 4, &crc, 4);
  }
  uint32_t crc = Crc32cExtend(0, p, 60);
  crc = Crc32cExtend(crc, p + 64, size_t{sections} * 32);
  std::memcpy(p + 60, &crc, 4);
  return bytes;
}

TEST(IndexTest, MemberChecksumsRoundTripWhenEveryMemberHasOne) {
  // SmallIndex's members carry no checksum: none recorded.
  auto plain = Index::FromString(SmallIndex(), "plain.idx");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE((*plain)->has_member_crc32c());
  IndexWriter w;
  ASSERT_TRUE(w.AddShard("a.tar", 10000, 1).ok());
  MemberInput json{MemberKind::kJson, "json", 512, 40};
  json.has_crc32c = true;
  json.crc32c = 0xdeadbeef;
  MemberInput img{MemberKind::kPng, "png", 1024, 900, 64, 48};
  img.has_crc32c = true;
  img.crc32c = 0x12345678;
  ASSERT_TRUE(w.AddSample("k", 3, &json, {img}).ok());
  ASSERT_TRUE(w.AddSample("t", 3, &json, {}).ok());
  auto ix = Index::FromString(w.Finish(), "crc.idx");
  ASSERT_TRUE(ix.ok()) << ix.status();
  ASSERT_TRUE((*ix)->has_member_crc32c());
  EXPECT_EQ((*ix)->text_crc32c(0), 0xdeadbeefu);
  EXPECT_EQ((*ix)->text_crc32c(1), 0xdeadbeefu);
  EXPECT_EQ((*ix)->media_crc32c((*ix)->media_begin(0)), 0x12345678u);
}

TEST(IndexTest, ShardNamesThatLeaveTheSourceAreRefusedAtLoad) {
  const std::string good = SmallIndex();
  ASSERT_TRUE(Index::FromString(ResealedWith(good, "a/000.tar", "b/000.tar"), "ok.idx").ok());
  for (const char* bad : {"../00.tar", "/a/000.ta", "a//00.tar", "a/./0.tar"}) {  // same length
    auto index = Index::FromString(ResealedWith(good, "a/000.tar", bad), "evil.idx");
    ASSERT_FALSE(index.ok()) << bad;
    EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss) << bad;
    EXPECT_NE(index.status().message().find("shard name"), std::string::npos)
        << bad << ": " << index.status();
    EXPECT_NE(index.status().message().find("evil.idx"), std::string::npos) << index.status();
  }
  auto latin1 = Index::FromString(ResealedWith(good, "a/000.tar", "a/\xE9\xE9\xE9.tar"), "l.idx");
  ASSERT_FALSE(latin1.ok());
  EXPECT_NE(latin1.status().message().find("UTF-8"), std::string::npos) << latin1.status();
  auto key = Index::FromString(ResealedWith(good, "longer/key-2", "longer/key\xFF\xFE"), "k.idx");
  ASSERT_FALSE(key.ok());
  EXPECT_NE(key.status().message().find("not UTF-8"), std::string::npos) << key.status();
}

TEST(IndexTest, WrongFilesAreRefusedWithAFix) {
  const std::string good = SmallIndex();
  auto truncated = Index::FromString(good.substr(0, good.size() - 9), "cut.idx");
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(truncated.status().message().find("rebuild"), std::string::npos);

  auto not_index = Index::FromString("hello, this is not an index at all, really not", "x.txt");
  ASSERT_FALSE(not_index.ok());
  EXPECT_NE(not_index.status().message().find("not a tutti index"), std::string::npos);

  std::string other_version = good;
  other_version[8] = 9;
  auto v = Index::FromString(other_version, "v9.idx");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("version 9"), std::string::npos) << v.status();

  auto missing = LoadIndex("/nonexistent/dir/index.idx");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("tutti index"), std::string::npos);
}

TEST(IndexTest, WriterRefusesBadSamples) {
  IndexWriter w;
  MemberInput json{MemberKind::kJson, "json", 0, 10};
  EXPECT_FALSE(w.AddSample("k", 1, &json, {}).ok());  // no shard yet
  ASSERT_TRUE(w.AddShard("s.tar", 100, 0).ok());
  EXPECT_FALSE(w.AddSample("k", 1, nullptr, {}).ok());  // no members
  MemberInput past{MemberKind::kJson, "json", 95, 10};
  EXPECT_FALSE(w.AddSample("k", 1, &past, {}).ok());  // outside the shard
  MemberInput empty_img{MemberKind::kJpeg, "jpg", 0, 10, 0, 10};
  EXPECT_FALSE(w.AddSample("k", 1, nullptr, {empty_img}).ok());
}

// The content's identity does not depend on the path the file is loaded
// from (relative, absolute, through a symlink, a copy) nor on where the
// shards were indexed from; any change to what the index holds changes it.
TEST(IndexTest, ContentIdFollowsTheContentNotThePath) {
  namespace fs = std::filesystem;
  auto build = [](const std::string& source_dir, uint32_t tokens) {
    IndexWriter w;
    w.SetSourceDir(source_dir);
    w.AddMeta("builder", source_dir);
    EXPECT_TRUE(w.AddShard("a/000.tar", 100000, 0xabcdef01).ok());
    MemberInput json{MemberKind::kJson, "json", 512, 40};
    EXPECT_TRUE(w.AddSample("k0", tokens, &json, {}).ok());
    MemberInput img{MemberKind::kPng, "0.png", 2048, 900, 640, 480};
    EXPECT_TRUE(w.AddSample("k1", 5, &json, {img}).ok());
    return w.Finish();
  };
  char tmpl[] = "/tmp/tutti_index_id_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl;
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return (dir / name).string();
  };
  const std::string absolute = write("a.idx", build("/data/set", 12));
  const std::string copy = write("copy.idx", build("/data/set", 12));
  const std::string elsewhere = write("elsewhere.idx", build("/mnt/other/mount", 12));
  const std::string other = write("other.idx", build("/data/set", 13));
  fs::create_symlink(absolute, dir / "link.idx");
  auto id = [](const std::string& path) {
    auto index = LoadIndex(path);
    EXPECT_TRUE(index.ok()) << path << ": " << index.status();
    return index.ok() ? (*index)->content_id() : std::string("error");
  };
  const std::string want = id(absolute);
  EXPECT_EQ(want.size(), 16u) << want;
  EXPECT_EQ(id(fs::relative(absolute).string()), want) << fs::relative(absolute);
  EXPECT_EQ(id((dir / "." / "a.idx").string()), want);
  EXPECT_EQ(id((dir / "link.idx").string()), want);
  EXPECT_EQ(id(copy), want);
  EXPECT_EQ(id(elsewhere), want);  // only the build metadata differs
  EXPECT_NE(id(other), want);      // one sample's token count differs
  EXPECT_NE(id(other), "error");
  fs::remove_all(dir);
}

TEST(IndexTest, FileRoundTripAndMemory) {
  SyntheticOptions o;
  o.samples = 20000;
  auto bytes = MakeSyntheticIndex(o);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  char dir[] = "/tmp/tutti_index_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/syn.idx";
  FILE* f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  fwrite(bytes->data(), 1, bytes->size(), f);
  fclose(f);
  auto index = LoadIndex(path);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ((*index)->num_samples(), 20000u);
  // The seed mix costs well under 64 bytes per sample in memory.
  EXPECT_LT(double((*index)->memory_bytes()) / 20000, 64.0);
  const double vl = double((*index)->vl_samples().size()) / 20000;
  EXPECT_NEAR(vl, 0.2, 0.02);
  unlink(path.c_str());
  rmdir(dir);
}

// An index written by the tutti before format version 2 is refused with a
// message that says to re-run `tutti index`.
TEST(IndexTest, FormatOneIsRefusedSayingToRerunTuttiIndex) {
  const std::string path = std::string(TUTTI_INDEX_TESTDATA) + "/format1.idx";
  auto old = LoadIndex(path);
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(old.status().message().find("format version 1"), std::string::npos) << old.status();
  EXPECT_NE(old.status().message().find("re-run `tutti index --source DIR --out " + path),
            std::string::npos)
      << old.status();
}

// `bytes` with one more section (laid out again, every checksum fixed).
std::string WithSection(const std::string& bytes, uint32_t tag, uint8_t flags,
                        index_format::Rows rows, uint16_t row_bytes, const std::string& data) {
  namespace fmt = index_format;
  uint32_t n;
  std::memcpy(&n, bytes.data() + 12, 4);
  std::vector<fmt::SectionEntry> entries(n);
  std::vector<std::string> datas;
  for (uint32_t i = 0; i < n; ++i) {
    std::memcpy(&entries[i], bytes.data() + 64 + i * 32, 32);
    datas.push_back(bytes.substr(entries[i].offset, entries[i].bytes));
  }
  fmt::SectionEntry e{};
  e.tag = tag;
  e.flags = flags;
  e.rows = static_cast<uint8_t>(rows);
  e.row_bytes = row_bytes;
  entries.push_back(e);
  datas.push_back(data);
  ++n;
  std::string out = bytes.substr(0, 64);
  std::memcpy(out.data() + 12, &n, 4);
  uint64_t at = (64 + n * 32 + 7) / 8 * 8;
  for (uint32_t i = 0; i < n; ++i) {
    entries[i].offset = at;
    entries[i].bytes = datas[i].size();
    entries[i].crc32c = Crc32c(datas[i]);
    at += (datas[i].size() + 7) / 8 * 8;
  }
  out.resize(at, '\0');
  std::memcpy(out.data() + 16, &at, 8);
  for (uint32_t i = 0; i < n; ++i) {
    std::memcpy(out.data() + 64 + i * 32, &entries[i], 32);
    std::memcpy(out.data() + entries[i].offset, datas[i].data(), datas[i].size());
  }
  uint32_t crc = Crc32cExtend(0, out.data(), 60);
  crc = Crc32cExtend(crc, out.data() + 64, size_t{n} * 32);
  std::memcpy(out.data() + 60, &crc, 4);
  return out;
}

// A column added by a later tutti: read past when it may be ignored (its
// size still checked), refused naming it when it may not.
TEST(IndexTest, AnUnknownSectionIsIgnoredUnlessRequired) {
  namespace fmt = index_format;
  const std::string good = SmallIndex();
  const uint32_t tag = fmt::Tag("PLCH");
  const std::string column(4 * 4, '\x07');  // a u32 per sample
  auto extra = Index::FromString(WithSection(good, tag, 0, fmt::Rows::kSamples, 4, column), "x");
  ASSERT_TRUE(extra.ok()) << extra.status();
  EXPECT_EQ((*extra)->num_samples(), 4u);
  auto required = Index::FromString(
      WithSection(good, tag, fmt::kRequired, fmt::Rows::kSamples, 4, column), "new.idx");
  ASSERT_FALSE(required.ok());
  EXPECT_EQ(required.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(required.status().message().find("PLCH"), std::string::npos) << required.status();
  EXPECT_NE(required.status().message().find("newer tutti"), std::string::npos);
  auto short_column = Index::FromString(
      WithSection(good, tag, 0, fmt::Rows::kSamples, 4, column.substr(4)), "short.idx");
  ASSERT_FALSE(short_column.ok());
  EXPECT_EQ(short_column.status().code(), absl::StatusCode::kDataLoss);
}

TEST(IndexTest, ShardTimesSkipsAndBadShardsRoundTrip) {
  IndexWriter w;
  ASSERT_TRUE(w.AddShard("a.tar", 10000, 1, 1700000000123456789).ok());
  MemberInput json{MemberKind::kJson, "json", 512, 40};
  ASSERT_TRUE(w.AddSample("k", 3, &json, {}).ok());
  w.AddSkipped("bad_json", 2);
  w.AddSkipped("bad_image_header", 1);
  ASSERT_TRUE(w.AddShard("b.tar", 10000, 2, 5).ok());
  ASSERT_TRUE(w.AddSample("t", 3, &json, {}).ok());
  w.AddSkipped("too_many_images", 7);
  ASSERT_TRUE(w.AddBadShard("z.tar", 77, 8, "truncated tar: \xFF").ok());
  ASSERT_TRUE(w.AddBadShard("c.tar", 0, 9, "empty file").ok());
  EXPECT_FALSE(w.AddBadShard("../d.tar", 0, 9, "x").ok());
  auto ix = Index::FromString(w.Finish(), "rt.idx");
  ASSERT_TRUE(ix.ok()) << ix.status();
  EXPECT_EQ((*ix)->shard(0).mtime_ns, 1700000000123456789);
  ASSERT_EQ((*ix)->skips().size(), 3u);
  EXPECT_EQ((*ix)->skips()[1].reason, "bad_image_header");
  EXPECT_EQ((*ix)->skips()[2].shard, 1u);
  EXPECT_EQ((*ix)->skips()[2].count, 7u);
  ASSERT_EQ((*ix)->bad_shards().size(), 2u);
  EXPECT_EQ((*ix)->bad_shards()[0].name, "c.tar");  // by name
  EXPECT_EQ((*ix)->bad_shards()[1].size, 77u);
  EXPECT_EQ((*ix)->bad_shards()[1].why, "truncated tar: \\xff");  // made UTF-8
}

// LoadIndex maps the file: what it allocates does not grow with the
// samples (a few bytes per shard and per 256 samples), where reading the
// file into memory took its whole size and the streams 4 bytes a sample.
TEST(IndexTest, LoadingMapsTheFileAndAllocatesNothingPerSample) {
  SyntheticOptions o;
  o.samples = 1'000'000;
  char dir[] = "/tmp/tutti_index_map_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/big.idx";
  ASSERT_TRUE(WriteSyntheticIndex(o, path).ok());
  const uint64_t before = HeapInUseBytes();
  auto index = LoadIndex(path);
  const uint64_t grown = HeapInUseBytes() - before;
  ASSERT_TRUE(index.ok()) << index.status();
  const Index& ix = **index;
  EXPECT_TRUE(ix.mapped());
  EXPECT_EQ(ix.num_samples(), 1'000'000u);
  EXPECT_GT(ix.file_bytes(), 30'000'000u);
  // 1,000 shards of 1,000 samples: about 100 KB of shard tables.
  EXPECT_LT(grown, 1u << 20) << "bytes allocated by loading " << ix.num_samples() << " samples";
  EXPECT_LT(ix.heap_bytes(), 1u << 20);
  EXPECT_EQ(ix.mapped_bytes(), ix.file_bytes());
  uint64_t tokens = 0;
  for (uint32_t s : ix.text_samples()) tokens += ix.text_tokens(s);
  EXPECT_GT(tokens, 0u);
  index = absl::InternalError("released");
  unlink(path.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace tutti::packer
