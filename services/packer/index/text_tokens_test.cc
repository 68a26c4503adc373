#include "services/packer/index/text_tokens.h"

#include "gtest/gtest.h"

namespace tutti::packer {
namespace {

TEST(TextTokensTest, InputIds) {
  auto n = JsonTokenCount(
      R"({"id": "x", "input_ids": [1, 2, 3, 40000], "meta": {"a": [1, {"b": null}]}})", 4);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 4u);
  EXPECT_EQ(*JsonTokenCount(R"({"input_ids": []})", 4), 0u);
}

TEST(TextTokensTest, CountFieldsAndTextEstimate) {
  EXPECT_EQ(*JsonTokenCount(R"({"num_tokens": 77})", 4), 77u);
  EXPECT_EQ(*JsonTokenCount(R"({"token_count": 12, "text": "ignored"})", 4), 12u);
  EXPECT_EQ(*JsonTokenCount(R"({"text": "abcdefghi"})", 4), 3u);  // ceil(9 / 4)
  // input_ids wins over a count.
  EXPECT_EQ(*JsonTokenCount(R"({"num_tokens": 77, "input_ids": [5, 6]})", 4), 2u);
  EXPECT_EQ(EstimateTextTokens(4000, 4), 1000u);
  EXPECT_EQ(EstimateTextTokens(4001, 4), 1001u);
}

TEST(TextTokensTest, BadJson) {
  for (const char* bad :
       {"", "[1,2]", "{", R"({"input_ids": [1, 2)", R"({"a": tru})", R"({"num_tokens": -3})",
        R"({"num_tokens": 1.5})", "{} trailing", R"({"a": "unterminated})"}) {
    auto n = JsonTokenCount(bad, 4);
    ASSERT_FALSE(n.ok()) << bad;
    EXPECT_EQ(n.status().code(), absl::StatusCode::kDataLoss) << bad;
  }
  auto none = JsonTokenCount(R"({"caption_id": 3})", 4);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tutti::packer
