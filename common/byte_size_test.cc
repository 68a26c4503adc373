#include "common/byte_size.h"

#include "gtest/gtest.h"

namespace tutti {
namespace {

TEST(ByteSizeTest, ParsesPlainAndSuffixedSizes) {
  uint64_t v = 0;
  ASSERT_TRUE(ParseByteSize("123", &v));
  EXPECT_EQ(v, 123u);
  ASSERT_TRUE(ParseByteSize("64K", &v));
  EXPECT_EQ(v, 64u << 10);
  ASSERT_TRUE(ParseByteSize("1m", &v));
  EXPECT_EQ(v, 1u << 20);
  ASSERT_TRUE(ParseByteSize("500G", &v));
  EXPECT_EQ(v, 500ull << 30);
  ASSERT_TRUE(ParseByteSize("2T", &v));
  EXPECT_EQ(v, 2ull << 40);
  ASSERT_TRUE(ParseByteSize("0", &v));
  EXPECT_EQ(v, 0u);
}

TEST(ByteSizeTest, RefusesMalformedAndOverflowingSizes) {
  uint64_t v = 7;
  for (const char* bad : {"", "G", "1.5G", "-1", "12X", "1 G", "99999999999999999999",
                          "20000000T"}) {
    EXPECT_FALSE(ParseByteSize(bad, &v)) << bad;
  }
  EXPECT_EQ(v, 7u);
}

TEST(ByteSizeTest, FormatsWithBinaryUnits) {
  EXPECT_EQ(FormatBytes(12), "12 B");
  EXPECT_EQ(FormatBytes(640 << 10), "640.0 KiB");
  EXPECT_EQ(FormatBytes(3ull << 29), "1.5 GiB");
}

}  // namespace
}  // namespace tutti
