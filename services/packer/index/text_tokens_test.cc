#include "services/packer/index/text_tokens.h"

#include <string>
#include <vector>

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

TEST(TextTokensTest, InputIdsMustBeTokenIds) {
  // Not a list: refused, not counted as 0 tokens (the caption would vanish).
  auto text = JsonTokenCount(R"({"input_ids": "abc"})", 4);
  ASSERT_EQ(text.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(text.status().message().find("not a list"), std::string::npos);
  // Each element an integer in [0, vocab): the first bad one named.
  for (auto [json, what] :
       {std::pair{R"({"input_ids": [-5, 1]})", "input_ids[0] is -5, outside"},
        {R"({"input_ids": [1, 2, 3.5]})", "input_ids[2] is 3.5, not an integer"},
        {R"({"input_ids": [1, "7"]})", "input_ids[1] is \"7\", not an integer"},
        {R"({"input_ids": [1, 2e3]})", "input_ids[1] is 2000.0, not an integer"}}) {
    auto n = JsonTokenCount(json, 4);
    ASSERT_EQ(n.status().code(), absl::StatusCode::kDataLoss) << json;
    EXPECT_NE(n.status().message().find(what), std::string::npos) << n.status();
  }
  // An integer id at or above the vocabulary: OUT_OF_RANGE, the id named.
  EXPECT_EQ(*JsonTokenCount(R"({"input_ids": [0, 151935]})", 4, 151936), 2u);
  auto past = JsonTokenCount(R"({"input_ids": [0, 151936]})", 4, 151936);
  ASSERT_EQ(past.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(past.status().message().find("input_ids[1] is 151936, outside the vocabulary [0, "
                                         "151936)"),
            std::string::npos)
      << past.status();
  auto huge = JsonTokenCount(R"({"input_ids": [1, 99999999999999]})", 4);
  ASSERT_EQ(huge.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(huge.status().message().find("input_ids[1] is 99999999999999, outside"),
            std::string::npos);
}

// The top-level fields tutti does not read are named (a misspelt input_ids
// would otherwise be an estimate from "text", silently).
TEST(TextTokensTest, UnknownFieldsAreNamed) {
  std::vector<std::string> unknown;
  auto n = JsonTokenCount(
      R"({"url": "x", "input_id": [1, 2], "text": "abcd", "extra": {"input_ids": [9]}})", 4, 0,
      &unknown);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1u);  // from "text": the misspelt list is not read
  EXPECT_EQ(unknown, (std::vector<std::string>{"url", "input_id", "extra"}));
  unknown.clear();
  // The sample schema's fields are known, read here or not.
  ASSERT_TRUE(JsonTokenCount(R"({"input_ids": [1, 2], "meta": {"id": "7"}, "num_tokens": 2,)"
                             R"( "schema": 2, "source": "llava", "token_count": 2,)"
                             R"( "trained": [[0, 1]]})",
                             4, 0, &unknown)
                  .ok());
  EXPECT_TRUE(unknown.empty());
  std::string many = "{";
  for (int i = 0; i < 40; ++i) many += "\"f" + std::to_string(i) + "\": 1, ";
  many += "\"" + std::string(100, 'k') + "\": 1, \"input_ids\": []}";
  unknown.clear();
  ASSERT_TRUE(JsonTokenCount(many, 4, 0, &unknown).ok());
  EXPECT_EQ(unknown.size(), 16u);  // bounded
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
