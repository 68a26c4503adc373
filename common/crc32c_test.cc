#include "common/crc32c.h"

#include <string>

#include "gtest/gtest.h"

namespace tutti {
namespace {

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(zeros), 0x8A9136AAu);
}

TEST(Crc32cTest, ExtendMatchesWhole) {
  std::string s = "The quick brown fox jumps over the lazy dog, many times over.";
  uint32_t part = Crc32cExtend(0, s.data(), 10);
  part = Crc32cExtend(part, s.data() + 10, s.size() - 10);
  EXPECT_EQ(part, Crc32c(s));
}

}  // namespace
}  // namespace tutti
