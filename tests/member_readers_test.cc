// The index and the stager read a sample's k.json alike: what the index
// counts is what the stager serves, for every document either accepts.
#include <string>

#include "gtest/gtest.h"
#include "services/packer/index/text_tokens.h"
#include "services/stager/batch_layout.h"

namespace tutti {
namespace {

TEST(MemberReadersTest, IndexCountsWhatTheStagerServes) {
  for (const char* json : {
           R"({"input_ids": [1, 2, 3]})",
           R"({"text": "abcdefgh", "meta": {"input_ids": [9, 9, 9, 9, 9, 9, 9]}})",
           R"({"meta": {"input_ids": [9, 9]}, "input_ids": [4]})",
           R"({"input_ids": [4], "meta": {"input_ids": [9, 9]}})",
           R"({"caption": "see \"input_ids\": [7, 7, 7]", "num_tokens": 2})",
           R"({"labels": [1, 2], "inputs": {"input_ids": [5, 5, 5]}, "text": "abcd"})",
           R"({"schema": 2, "input_ids": [5, 6], "meta": {"input_ids": [1, 1, 1]}})",
       }) {
    auto counted = packer::JsonTokenCount(json, packer::kDefaultBytesPerToken);
    auto served = stager::ParseInputIds(json);
    ASSERT_TRUE(counted.ok()) << json << ": " << counted.status();
    if (served.ok()) {
      EXPECT_EQ(*counted, served->size()) << json;
    } else {
      // No top-level input_ids: the stager serves nothing of the document's
      // own (it has no ids), never ids from inside another field.
      EXPECT_EQ(served.status().code(), absl::StatusCode::kNotFound) << json << served.status();
    }
  }
}

TEST(MemberReadersTest, BothRefuseWhatEitherRefuses) {
  for (const char* json : {
           R"({"input_ids": [1, -3]})",
           R"({"input_ids": [1, 2.5]})",
           R"({"input_ids": [1, 2]} trailing)",
           R"({"input_ids": [1, 2], "x": tru})",
       }) {
    EXPECT_EQ(packer::JsonTokenCount(json, 4).status().code(), absl::StatusCode::kDataLoss) << json;
    EXPECT_EQ(stager::ParseInputIds(json).status().code(), absl::StatusCode::kDataLoss) << json;
  }
}

}  // namespace
}  // namespace tutti
