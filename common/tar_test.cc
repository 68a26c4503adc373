#include "common/tar.h"

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
