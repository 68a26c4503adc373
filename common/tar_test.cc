#include "common/tar.h"

#include <cstdio>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tutti {
namespace {

TEST(TarTest, RoundTripWithLongNames) {
  TarWriter w;
  w.Add("000001.json", "{\"input_ids\":[1,2,3]}");
  w.Add("000001.0.jpg", std::string(1000, 'x'));
  std::string long_name = std::string(120, 'd') + "/000002.txt";
  w.Add(long_name, "hi");
  auto file = MakeMemoryFile("shard.tar", w.Finish());
  auto members = ListTarMembers(*file);
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 3u);
  EXPECT_EQ((*members)[0].name, "000001.json");
  EXPECT_EQ((*members)[1].size, 1000u);
  EXPECT_EQ((*members)[2].name, long_name);
  EXPECT_EQ(*file->ReadString((*members)[2].data_offset, 2), "hi");
}

TEST(TarTest, TruncatedShardIsDataLoss) {
  TarWriter w;
  w.Add("a.json", std::string(5000, 'a'));
  std::string tar = w.Finish();
  auto file = MakeMemoryFile("cut.tar", tar.substr(0, 2048));
  auto members = ListTarMembers(*file);
  EXPECT_EQ(members.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(members.status().message().find("cut.tar"), std::string::npos);
  EXPECT_NE(members.status().message().find("truncated"), std::string::npos);
}

TEST(TarTest, CutInsideTheLastBlockIsTruncated) {
  TarWriter w;
  w.Add("a.json", std::string(100, 'a'));
  w.Add("b.json", std::string(100, 'b'));
  const std::string tar = w.Finish();
  // Cut after b's data but inside its 512-byte block (and before the end marker).
  auto file = MakeMemoryFile("cut.tar", tar.substr(0, 512 * 3 + 200));
  auto members = ListTarMembers(*file);
  ASSERT_EQ(members.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(members.status().message().find("truncated"), std::string::npos);
  EXPECT_NE(members.status().message().find("1736"), std::string::npos) << members.status();
}

TEST(TarTest, CorruptHeaderIsDataLoss) {
  TarWriter w;
  w.Add("a.json", "abc");
  std::string tar = w.Finish();
  tar[10] ^= 0x55;
  auto members = ListTarMembers(*MakeMemoryFile("bad.tar", tar));
  EXPECT_EQ(members.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(members.status().message().find("checksum"), std::string::npos);
}

TEST(TarTest, EscapingMemberNamesAreRefused) {
  for (const char* name : {"../evil.json", "/etc/passwd", "a/../../b.json"}) {
    TarWriter w;
    w.Add(name, "x");
    auto members = ListTarMembers(*MakeMemoryFile("evil.tar", w.Finish()));
    EXPECT_EQ(members.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(members.status().message().find(name), std::string::npos);
  }
}

// Rewrites the header at `offset` with `patch` applied and a valid checksum.
void PatchHeader(std::string* tar, size_t offset, const std::function<void(char*)>& patch) {
  char* h = tar->data() + offset;
  patch(h);
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (size_t i = 0; i < 512; ++i) sum += static_cast<unsigned char>(h[i]);
  std::snprintf(h + 148, 8, "%06o", sum);
}

TEST(TarTest, Base256SizeThatWrapsIsRefusedNotLooped) {
  // 2^64 - 512 in GNU base-256: data + RoundUp(size) would wrap back onto
  // this very header and loop forever.
  TarWriter w;
  w.Add("a.json", "abc");
  w.Add("b.json", "def");
  std::string tar = w.Finish();
  PatchHeader(&tar, 512 * 2, [](char* h) {
    std::memset(h + 124, 0, 12);
    h[124] = static_cast<char>(0x80);
    for (int i = 4; i < 12; ++i) h[124 + i] = static_cast<char>(0xFF);
    h[124 + 10] = static_cast<char>(0xFE);
    h[124 + 11] = 0;
  });
  auto members = ListTarMembers(*MakeMemoryFile("wrap.tar", tar));
  ASSERT_EQ(members.status().code(), absl::StatusCode::kDataLoss) << members.status();
  EXPECT_NE(members.status().message().find("wrap.tar"), std::string::npos);
  EXPECT_NE(members.status().message().find("1024"), std::string::npos) << members.status();
  // A negative base-256 number, and one wider than 64 bits, are not sizes either.
  for (auto fill : {std::pair{0, 0xFF}, {1, 0x01}}) {
    std::string t = tar;
    PatchHeader(&t, 512 * 2, [&](char* h) {
      std::memset(h + 124, 0, 12);
      h[124] = static_cast<char>(fill.first == 0 ? 0xFF : 0x80);
      h[125] = static_cast<char>(fill.second);  // 0x01 followed by 10 more bytes: 2^80
    });
    EXPECT_EQ(ListTarMembers(*MakeMemoryFile("neg.tar", t)).status().code(),
              absl::StatusCode::kDataLoss);
  }
}

TEST(TarTest, LinksAreReportedNotRead) {
  TarWriter w;
  w.Add("a.json", "abc");
  w.Add("b.jpg", "");
  w.Add("c.jpg", "");
  std::string tar = w.Finish();
  PatchHeader(&tar, 512 * 2, [](char* h) {
    h[156] = '2';
    std::strcpy(h + 157, "a.json");
  });
  PatchHeader(&tar, 512 * 3, [](char* h) { h[156] = '1'; });
  std::vector<std::string> files, skipped;
  auto s = ForEachTarMember(
      *MakeMemoryFile("links.tar", tar),
      [&](const TarMember& m) {
        files.push_back(m.name);
        return absl::OkStatus();
      },
      [&](const TarMember& m, absl::string_view why) {
        skipped.push_back(absl::StrCat(m.name, ": ", why));
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(files, std::vector<std::string>{"a.json"});
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_NE(skipped[0].find("b.jpg: a symbolic link to 'a.json'"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[1].find("c.jpg: a hard link"), std::string::npos) << skipped[1];
}

TEST(TarTest, SplitsWebDatasetNames) {
  auto [k, e] = SplitWebDatasetName("dir.v1/000042.0.jpg");
  EXPECT_EQ(k, "dir.v1/000042");
  EXPECT_EQ(e, "0.jpg");
  auto [k2, e2] = SplitWebDatasetName("abc");
  EXPECT_EQ(k2, "abc");
  EXPECT_EQ(e2, "");
}

}  // namespace
}  // namespace tutti
