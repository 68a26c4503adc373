#include "services/packer/index/index_builder.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "common/crc32c.h"
#include "common/tar.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/packer/index/index.h"

namespace tutti::packer {
namespace {

using ::testing::HasSubstr;

namespace fs = std::filesystem;

std::string Encode(const std::string& ext, int w, int h) {
  cv::Mat img(h, w, CV_8UC3, cv::Scalar(40, 80, 120));
  std::vector<uchar> buf;
  EXPECT_TRUE(cv::imencode(ext, img, buf));
  return std::string(buf.begin(), buf.end());
}

std::string Wav(uint32_t rate, uint32_t frames) {
  auto le32 = [](uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); };
  auto le16 = [](uint16_t v) { return std::string(reinterpret_cast<const char*>(&v), 2); };
  const uint32_t data = frames * 2;
  std::string s = "RIFF" + le32(36 + data) + "WAVEfmt " + le32(16) + le16(1) + le16(1) +
                  le32(rate) + le32(rate * 2) + le16(2) + le16(16) + "data" + le32(data);
  s.append(data, '\0');
  return s;
}

std::string Ids(int n) {
  std::string s = "{\"input_ids\": [";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(100 + i);
  return s + "]}";
}

class IndexBuilderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tutti_index_builder_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Write(const std::string& rel, const std::string& data) {
    fs::create_directories(fs::path(dir_ + "/" + rel).parent_path());
    std::ofstream(dir_ + "/" + rel, std::ios::binary) << data;
  }

  absl::StatusOr<std::shared_ptr<const Index>> Build(IndexBuildReport* report,
                                                     bool skip_bad = true,
                                                     IndexBuildOptions o = {}) {
    o.source_dir = dir_;
    o.skip_bad_shards = skip_bad;
    auto bytes = BuildIndex(o, report, nullptr);
    if (!bytes.ok()) return bytes.status();
    return Index::FromString(*bytes, "built.idx");
  }

  std::string dir_;
};

TEST_F(IndexBuilderTest, RoundTripOfAllMemberKinds) {
  TarWriter a;
  a.Add("000000.json", Ids(17));
  a.Add("000001.json", "{\"num_tokens\": 300}");
  a.Add("000001.0.jpg", Encode(".jpg", 640, 480));
  a.Add("000001.1.png", Encode(".png", 100, 50));
  a.Add("000002.txt", std::string(4001, 'x'));
  a.Add("000003.webp", Encode(".webp", 33, 44));
  a.Add("000003.json", "{\"source\": \"web\"}");  // metadata only: 0 text tokens
  a.Add("000004.wav", Wav(16000, 16000 * 3 / 2));
  a.Add("000004.txt", "hello world!");
  a.Add("000004.cls", "7");
  const std::string shard_a = a.Finish();
  Write("train/shard-000.tar", shard_a);
  TarWriter b;
  b.Add("sub/000005.json", Ids(3));
  Write("train/shard-001.tar", b.Finish());

  IndexBuildReport report;
  auto index = Build(&report);
  ASSERT_TRUE(index.ok()) << index.status();
  const Index& ix = **index;
  EXPECT_EQ(report.shards_indexed, 2u);
  EXPECT_EQ(report.samples, 6u);
  EXPECT_EQ(report.images, 3u);
  EXPECT_EQ(report.audio, 1u);
  EXPECT_EQ(report.ignored_members, 1u);  // the .cls
  EXPECT_TRUE(report.skipped.empty());
  ASSERT_EQ(ix.num_samples(), 6u);
  ASSERT_EQ(ix.num_shards(), 2u);
  EXPECT_EQ(ix.shard(0).name, "train/shard-000.tar");
  EXPECT_EQ(ix.shard(0).size, shard_a.size());
  EXPECT_EQ(ix.shard(0).crc32c, Crc32c(shard_a));

  EXPECT_EQ(ix.key(0), "000000");
  EXPECT_EQ(ix.text_tokens(0), 17u);
  EXPECT_EQ(ix.text_kind(0), MemberKind::kJson);
  EXPECT_EQ(shard_a.substr(ix.text_offset(0), ix.text_size(0)), Ids(17));

  EXPECT_EQ(ix.text_tokens(1), 300u);
  ASSERT_EQ(ix.media_end(1) - ix.media_begin(1), 2u);
  const MediaView jpg = ix.media(ix.media_begin(1));
  EXPECT_EQ(jpg.kind, MemberKind::kJpeg);
  EXPECT_EQ(jpg.width, 640u);
  EXPECT_EQ(jpg.height, 480u);
  EXPECT_EQ(ix.MemberName(1, jpg.ext), "000001.0.jpg");
  EXPECT_EQ(shard_a.substr(jpg.offset, 3), "\xFF\xD8\xFF");
  const MediaView png = ix.media(ix.media_begin(1) + 1);
  EXPECT_EQ(png.kind, MemberKind::kPng);
  EXPECT_EQ(png.width, 100u);

  EXPECT_EQ(ix.text_kind(2), MemberKind::kTxt);
  EXPECT_EQ(ix.text_tokens(2), 1001u);  // ceil(4001 / 4): the documented estimate

  EXPECT_EQ(ix.text_tokens(3), 0u);
  EXPECT_EQ(ix.media(ix.media_begin(3)).kind, MemberKind::kWebp);
  EXPECT_EQ(ix.media(ix.media_begin(3)).height, 44u);

  EXPECT_EQ(ix.media(ix.media_begin(4)).kind, MemberKind::kWav);
  EXPECT_EQ(ix.media(ix.media_begin(4)).audio_ms, 1500u);
  EXPECT_EQ(ix.text_tokens(4), 3u);

  EXPECT_EQ(ix.key(5), "sub/000005");
  EXPECT_EQ(ix.ShardOf(5), 1u);
  EXPECT_EQ(ix.text_samples(), (std::vector<uint32_t>{0, 2, 5}));
  EXPECT_EQ(ix.vl_samples(), (std::vector<uint32_t>{1, 3, 4}));
}

TEST_F(IndexBuilderTest, CorruptSamplesAreSkippedAndCounted) {
  TarWriter t;
  t.Add("good.json", Ids(5));
  t.Add("badimg.json", Ids(5));
  std::string jpg = Encode(".jpg", 64, 64);
  t.Add("badimg.jpg", jpg.substr(0, 40));  // header cut before the frame header
  t.Add("notimage.png", "this is not a png");
  t.Add("badjson.json", "{\"input_ids\": [1, 2");
  t.Add("nothing.cls", "3");
  t.Add("wide.jpg", Encode(".jpg", 4000, 10));  // aspect ratio 400
  t.Add("good2.txt", "abcd");
  Write("s.tar", t.Finish());
  IndexBuildReport report;
  auto index = Build(&report);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ((*index)->num_samples(), 2u);
  EXPECT_EQ(report.skipped["bad_image_header"], 2u);
  EXPECT_EQ(report.skipped["bad_json"], 1u);
  EXPECT_EQ(report.skipped["no_usable_member"], 1u);
  EXPECT_EQ(report.skipped["aspect_ratio"], 1u);
  bool named = false;
  for (const auto& e : report.skipped_examples)
    named |= e.find("s.tar:badimg") != std::string::npos;
  EXPECT_TRUE(named);
}

TEST_F(IndexBuilderTest, BadShardsAreSkippedOrFail) {
  TarWriter good;
  good.Add("a.json", Ids(4));
  Write("0-good.tar", good.Finish());
  TarWriter trunc;
  trunc.Add("b.json", Ids(4));
  trunc.Add("b.jpg", Encode(".jpg", 300, 300));
  const std::string full = trunc.Finish();
  Write("1-truncated.tar", full.substr(0, full.size() / 2));
  TarWriter evil;
  evil.Add("../../etc/c.json", Ids(4));
  Write("2-escape.tar", evil.Finish());
  TarWriter abs;
  abs.Add("/abs/d.json", Ids(4));
  Write("3-absolute.tar", abs.Finish());

  IndexBuildReport report;
  auto index = Build(&report);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ((*index)->num_samples(), 1u);
  EXPECT_EQ(report.shards_indexed, 1u);
  ASSERT_EQ(report.bad_shards.size(), 3u);
  EXPECT_NE(report.bad_shards[0].find("1-truncated.tar"), std::string::npos);
  EXPECT_NE(report.bad_shards[0].find("truncated"), std::string::npos);
  EXPECT_NE(report.bad_shards[1].find(".."), std::string::npos);
  EXPECT_NE(report.bad_shards[2].find("absolute"), std::string::npos);

  auto strict = Build(&report, /*skip_bad=*/false);
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("1-truncated.tar"), std::string::npos);
  EXPECT_NE(strict.status().message().find("--skip-bad-shards"), std::string::npos);
}

TEST_F(IndexBuilderTest, EveryMemberIsRecordedWithItsChecksum) {
  TarWriter t;
  const std::string json = Ids(5), png = Encode(".png", 60, 40);
  t.Add("a.json", json);
  t.Add("a.png", png);
  t.Add("b.json", std::string(5 << 20, ' ') + Ids(2));  // spans chunks of the checksum pass
  Write("s.tar", t.Finish());
  IndexBuildReport report;
  auto index = Build(&report);
  ASSERT_TRUE(index.ok()) << index.status();
  const Index& ix = **index;
  ASSERT_TRUE(ix.has_member_crc32c());
  EXPECT_EQ(ix.text_crc32c(0), Crc32c(json));
  EXPECT_EQ(ix.media_crc32c(ix.media_begin(0)), Crc32c(png));
  EXPECT_EQ(ix.text_crc32c(1), Crc32c(std::string(5 << 20, ' ') + Ids(2)));
}

TEST_F(IndexBuilderTest, ZeroByteShardAndLinkMembersAreCountedWithAReason) {
  TarWriter good;
  good.Add("a.json", Ids(4));
  good.Add("b.json", Ids(4));
  std::string tar = good.Finish();
  // Make b.json a symbolic link (valid checksum): it is not read, but counted.
  char* h = tar.data() + 1024;
  h[156] = '2';
  std::strcpy(h + 157, "a.json");
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; ++i) sum += static_cast<unsigned char>(h[i]);
  std::snprintf(h + 148, 8, "%06o", sum);
  Write("0-links.tar", tar);
  Write("1-empty.tar", "");
  IndexBuildReport report;
  auto index = Build(&report);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ((*index)->num_samples(), 1u);
  EXPECT_EQ(report.skipped_members["link"], 1u);
  bool named = false;
  for (const auto& e : report.skipped_examples) {
    named |= e.find("0-links.tar: member b.json is a symbolic link") != std::string::npos;
  }
  EXPECT_TRUE(named);
  ASSERT_EQ(report.bad_shards.size(), 1u);
  EXPECT_NE(report.bad_shards[0].find("1-empty.tar: empty file (0 bytes)"), std::string::npos)
      << report.bad_shards[0];
  EXPECT_EQ(report.shards_indexed, 1u);
}

TEST_F(IndexBuilderTest, NonUtf8NamesAreRefusedWithTheNameEscaped) {
  TarWriter t;
  t.Add("good.json", Ids(3));
  t.Add(std::string("caf\xE9.json"), Ids(3));  // Latin-1, not UTF-8
  Write("s.tar", t.Finish());
  TarWriter u;
  u.Add("other.json", Ids(3));
  Write(std::string("bad\xFFname.tar"), u.Finish());
  IndexBuildReport report;
  auto index = Build(&report);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ((*index)->num_samples(), 1u);
  EXPECT_EQ((*index)->key(0), "good");
  EXPECT_EQ(report.skipped["bad_name"], 1u);
  ASSERT_FALSE(report.skipped_examples.empty());
  EXPECT_NE(report.skipped_examples[0].find("caf\\xe9"), std::string::npos)
      << report.skipped_examples[0];
  ASSERT_EQ(report.bad_shards.size(), 1u);
  EXPECT_NE(report.bad_shards[0].find("bad\\xffname.tar"), std::string::npos) << report.bad_shards[0];
  EXPECT_NE(report.bad_shards[0].find("UTF-8"), std::string::npos);
}

TEST_F(IndexBuilderTest, SymlinkedShardsKeepTheNameFoundUnderSource) {
  TarWriter t;
  t.Add("a.json", Ids(3));
  // The link's target is beneath the source (not a .tar name of its own).
  fs::create_directories(dir_ + "/real");
  std::ofstream(dir_ + "/real/shard-000001.data", std::ios::binary) << t.Finish();
  fs::create_directories(dir_ + "/data");
  fs::create_symlink("../real/shard-000001.data", dir_ + "/data/shard-000001.tar");
  IndexBuildReport report;
  IndexBuildOptions o;
  o.source_dir = dir_ + "/";  // a trailing slash changes nothing
  auto bytes = BuildIndex(o, &report, nullptr);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto index = Index::FromString(*bytes, "l.idx");
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ((*index)->shards().size(), 1u);
  EXPECT_EQ((*index)->shards()[0].name, "data/shard-000001.tar");
  EXPECT_TRUE(report.bad_shards.empty());
}

// What the stager would refuse to open is not indexed, each named with why:
// a shard linked out of the source, a directory linked out of it (not
// walked), a FIFO named as a shard (which would block an open).
TEST_F(IndexBuilderTest, ShardsTheStagerWouldRefuseAreLeftOutNamingWhy) {
  TarWriter t;
  t.Add("a.json", Ids(3));
  const std::string shard = t.Finish();
  const fs::path out = fs::path(dir_).parent_path() / (fs::path(dir_).filename().string() + "-out");
  fs::create_directories(out / "more");
  std::ofstream(out / "secret.tar", std::ios::binary) << shard;
  std::ofstream(out / "more" / "shard-000009.tar", std::ios::binary) << shard;
  std::ofstream(dir_ + "/shard-000001.tar", std::ios::binary) << shard;
  fs::create_symlink(out / "secret.tar", dir_ + "/shard-000002.tar");
  fs::create_symlink(out / "more", dir_ + "/more");
  ASSERT_EQ(::mkfifo((dir_ + "/shard-000003.tar").c_str(), 0600), 0);
  IndexBuildReport report;
  IndexBuildOptions o;
  o.source_dir = dir_;
  auto bytes = BuildIndex(o, &report, nullptr);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto index = Index::FromString(*bytes, "l.idx");
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ((*index)->shards().size(), 1u);
  EXPECT_EQ((*index)->shards()[0].name, "shard-000001.tar");
  ASSERT_EQ(report.bad_shards.size(), 3u);
  EXPECT_THAT(report.bad_shards[0], HasSubstr("more: directory"));
  EXPECT_THAT(report.bad_shards[0], HasSubstr("its shards are not indexed"));
  EXPECT_THAT(report.bad_shards[1], HasSubstr("shard-000002.tar: shard"));
  EXPECT_THAT(report.bad_shards[1], HasSubstr(dir_));
  EXPECT_THAT(report.bad_shards[2], HasSubstr("shard-000003.tar: not a regular file"));
  // Without --skip-bad-shards the index is refused, naming the first.
  o.skip_bad_shards = false;
  auto refused = BuildIndex(o, &report, nullptr);
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("more: directory"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--skip-bad-shards"));
  fs::remove_all(out);
}

TEST_F(IndexBuilderTest, BadInputIdsSkipTheSampleNamingIt) {
  TarWriter t;
  t.Add("ok.json", Ids(3));
  t.Add("str.json", R"({"input_ids": "abc"})");
  t.Add("str.jpg", Encode(".jpg", 64, 64));  // a VL sample: its caption must not vanish
  t.Add("mixed.json", R"({"input_ids": [-5, 99999999999999, 3.5]})");
  t.Add("big.json", R"({"input_ids": [1, 200000]})");
  Write("s.tar", t.Finish());
  IndexBuildReport report;
  IndexBuildOptions o;
  o.source_dir = dir_;
  o.vocab_size = 151936;
  auto bytes = BuildIndex(o, &report, nullptr);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(report.samples, 1u);
  EXPECT_EQ(report.skipped["bad_json"], 2u);
  EXPECT_EQ(report.skipped["token_out_of_vocab"], 1u);
  std::string all;
  for (const auto& e : report.skipped_examples) all += e + "\n";
  EXPECT_NE(all.find("s.tar:str: str.json: \"input_ids\" is not a list"), std::string::npos) << all;
  EXPECT_NE(all.find("s.tar:mixed: mixed.json: input_ids[0] is -5"), std::string::npos) << all;
  EXPECT_NE(all.find("s.tar:big: big.json: input_ids[1] is 200000, outside the vocabulary [0, 151936)"),
            std::string::npos)
      << all;
}

// Without --vocab-size the ids are checked against the default vocabulary
// (Qwen2-VL's, as the job config's image token ids), not any int32; the
// k.json fields tutti does not know are counted and named.
TEST_F(IndexBuilderTest, TheVocabularyIsBoundedByDefaultAndUnknownFieldsAreCounted) {
  TarWriter t;
  t.Add("ok.json",
        R"({"input_ids": [1, 151935], "url": "http://x", "lang": "en", "source": "web"})");
  t.Add("typo.json", R"({"input_id": [1, 2], "text": "abcdefgh", "url": "http://y"})");
  t.Add("beyond.json", R"({"input_ids": [1, 151936]})");
  t.Add("plain.json", R"({"input_ids": [3]})");
  Write("s.tar", t.Finish());
  IndexBuildReport report;
  IndexBuildOptions o;
  o.source_dir = dir_;
  EXPECT_EQ(o.vocab_size, 151936u);
  auto bytes = BuildIndex(o, &report, nullptr);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(report.samples, 3u);
  EXPECT_EQ(report.skipped["token_out_of_vocab"], 1u);
  std::string all;
  for (const auto& e : report.skipped_examples) all += e + "\n";
  EXPECT_THAT(all, HasSubstr("s.tar:beyond: beyond.json: input_ids[1] is 151936, outside the "
                             "vocabulary [0, 151936) (--vocab-size)"));
  EXPECT_EQ(report.unknown_json_members, 2u);
  EXPECT_EQ(report.unknown_json_fields,
            (std::map<std::string, uint64_t>{{"input_id", 1}, {"lang", 1}, {"url", 2}}));
  EXPECT_EQ(report.unknown_json_other, 0u);
}

TEST_F(IndexBuilderTest, OnlyBadShardsStillReportEveryReason) {
  Write("a.tar", std::string(2048, 'j'));
  Write("b.tar", "");
  IndexBuildReport report;
  auto index = Build(&report);
  ASSERT_FALSE(index.ok());
  EXPECT_EQ(report.bad_shards.size(), 2u);  // what `tutti index` prints above the error
}

TEST_F(IndexBuilderTest, MissingOrEmptySource) {
  IndexBuildOptions o;
  o.source_dir = dir_ + "/does-not-exist";
  auto missing = BuildIndex(o, nullptr, nullptr);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("does-not-exist"), std::string::npos);
  EXPECT_NE(missing.status().message().find("--source"), std::string::npos);

  o.source_dir = dir_;
  auto empty = BuildIndex(o, nullptr, nullptr);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("no .tar shards"), std::string::npos);

  Write("junk.tar", std::string(2048, 'j'));  // not a tar at all
  IndexBuildReport report;
  auto junk = BuildIndex(o, &report, nullptr);
  ASSERT_FALSE(junk.ok());
  EXPECT_NE(junk.status().message().find("no usable sample"), std::string::npos);
  ASSERT_EQ(report.bad_shards.size(), 1u);
  EXPECT_NE(report.bad_shards[0].find("junk.tar"), std::string::npos);
}

TEST_F(IndexBuilderTest, ProgressCoversEveryShard) {
  for (int i = 0; i < 5; ++i) {
    TarWriter t;
    t.Add("k" + std::to_string(i) + ".json", Ids(2));
    Write("s" + std::to_string(i) + ".tar", t.Finish());
  }
  IndexBuildOptions o;
  o.source_dir = dir_;
  o.threads = 3;
  uint32_t last_done = 0, total = 0;
  auto bytes = BuildIndex(o, nullptr, [&](const IndexBuildProgress& p) {
    EXPECT_GE(p.shards_done, last_done);
    last_done = p.shards_done;
    total = p.shards_total;
  });
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(last_done, 5u);
  EXPECT_EQ(total, 5u);
  auto index = Index::FromString(*bytes, "p.idx");
  ASSERT_TRUE(index.ok());
  // Shard order is the sorted path order whatever the thread finishing order.
  for (uint32_t i = 0; i < 5; ++i) EXPECT_EQ((*index)->key(i), "k" + std::to_string(i));
}

TEST_F(IndexBuilderTest, ImagesPerSampleAreBoundedAtTheLimit) {
  TarWriter a;
  a.Add("000000.json", Ids(5));
  for (int i = 0; i < 3; ++i) a.Add("000000." + std::to_string(i) + ".png", Encode(".png", 30, 20));
  a.Add("000001.json", Ids(5));
  for (int i = 0; i < 4; ++i) a.Add("000001." + std::to_string(i) + ".png", Encode(".png", 30, 20));
  a.Add("000001.wav", Wav(16000, 1600));  // audio is not an image
  Write("a.tar", a.Finish());
  IndexBuildOptions o;
  o.max_images_per_sample = 3;
  IndexBuildReport report;
  auto ix = Build(&report, true, o);
  ASSERT_TRUE(ix.ok()) << ix.status();
  ASSERT_EQ((*ix)->num_samples(), 1u);  // 3 images: at the limit
  EXPECT_EQ((*ix)->key(0), "000000");
  EXPECT_EQ(report.skipped["too_many_images"], 1u);  // 4: one over
  ASSERT_FALSE(report.skipped_examples.empty());
  EXPECT_NE(report.skipped_examples[0].find("000001 has 4 images, over the limit "
                                            "(--max-images-per-sample 3)"),
            std::string::npos)
      << report.skipped_examples[0];
}

TEST_F(IndexBuilderTest, MembersPerShardAreBoundedAtTheLimit) {
  TarWriter at, over;
  for (int i = 0; i < 4; ++i) at.Add("00000" + std::to_string(i) + ".json", Ids(3));
  for (int i = 0; i < 5; ++i) over.Add("00000" + std::to_string(i) + ".json", Ids(3));
  Write("at.tar", at.Finish());
  Write("over.tar", over.Finish());
  IndexBuildOptions o;
  o.max_shard_members = 4;
  IndexBuildReport report;
  auto ix = Build(&report, true, o);
  ASSERT_TRUE(ix.ok()) << ix.status();
  ASSERT_EQ((*ix)->num_shards(), 1u);
  EXPECT_EQ((*ix)->shard(0).name, "at.tar");
  EXPECT_EQ((*ix)->num_samples(), 4u);
  ASSERT_EQ(report.bad_shards.size(), 1u);
  EXPECT_NE(report.bad_shards[0].find("over.tar: more than 4 tar members, over the limit "
                                      "(--max-shard-members 4)"),
            std::string::npos)
      << report.bad_shards[0];
  // Without skipping bad shards the build fails naming the shard and the limit.
  auto failed = Build(&report, false, o);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted) << failed.status();
  EXPECT_NE(failed.status().message().find("over.tar"), std::string::npos) << failed.status();
}

}  // namespace
}  // namespace tutti::packer
