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

TEST(Crc32cTest, CombineMatchesWhole) {
  std::string data;
  for (int i = 0; i < 100000; ++i) data.push_back(static_cast<char>(i * 7 + (i >> 5)));
  for (size_t cut : {size_t{0}, size_t{1}, size_t{4096}, size_t{65537}, data.size()}) {
    const uint32_t a = tutti::Crc32c(absl::string_view(data).substr(0, cut));
    const uint32_t b = tutti::Crc32c(absl::string_view(data).substr(cut));
    EXPECT_EQ(tutti::Crc32cCombine(a, b, data.size() - cut), tutti::Crc32c(data)) << cut;
  }
}

}  // namespace
}  // namespace tutti
