#include "common/sample_json.h"

#include <string>

#include "gtest/gtest.h"

namespace tutti {
namespace {

using Spans = std::vector<std::pair<uint32_t, uint32_t>>;

TEST(SampleJsonTest, SchemaOneIsTodaysDocument) {
  auto s = ParseSampleJson(R"({"id": "x", "input_ids": [1, 2, 3], "meta": {"a": [1]}})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->schema, 1);
  EXPECT_TRUE(s->has_input_ids);
  EXPECT_EQ(s->input_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(s->has_trained);
  EXPECT_TRUE(s->meta.empty());  // a schema-1 document's fields are the user's
  EXPECT_EQ(s->unknown_fields, (std::vector<std::string>{"id"}));  // named, not refused
  auto counted = ParseSampleJson(R"({"num_tokens": 7, "text": "abc"})");
  ASSERT_TRUE(counted.ok());
  EXPECT_FALSE(counted->has_input_ids);
  EXPECT_EQ(counted->token_count, 7u);
  EXPECT_EQ(counted->text_bytes, 3u);
}

TEST(SampleJsonTest, OnlyTheTopLevelInputIdsCount) {
  // A nested "input_ids" is the user's metadata, not the sample's tokens.
  auto nested = ParseSampleJson(R"({"meta": {"input_ids": [9, 9]}, "text": "abcd"})");
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_FALSE(nested->has_input_ids);
  auto both = ParseSampleJson(R"({"meta": {"input_ids": [9, 9]}, "input_ids": [4]})");
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->input_ids, (std::vector<int32_t>{4}));
  // In a string it is text.
  auto quoted = ParseSampleJson(R"({"text": "\"input_ids\": [5]"})");
  ASSERT_TRUE(quoted.ok());
  EXPECT_FALSE(quoted->has_input_ids);
}

TEST(SampleJsonTest, SchemaTwo) {
  SampleJsonOptions o;
  o.image_placeholder_id = 100;
  o.audio_placeholder_id = 101;
  auto s = ParseSampleJson(
      R"({"schema": 2, "input_ids": [1, 100, 2, 3, 100, 101, 4], "trained": [[2, 4], [6, 7]],
          "source": "chartqa", "meta": {"q": [1, "two"]}, "extra": 1})",
      o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->schema, 2);
  EXPECT_EQ(s->image_positions, (std::vector<uint32_t>{1, 4}));
  EXPECT_EQ(s->audio_positions, (std::vector<uint32_t>{5}));
  EXPECT_EQ(s->text_tokens(), 4u);
  EXPECT_TRUE(s->has_trained);
  EXPECT_EQ(s->trained, (Spans{{2, 4}, {6, 7}}));
  EXPECT_EQ(s->source, "chartqa");
  EXPECT_EQ(s->meta, R"({"q":[1,"two"]})");
  EXPECT_EQ(s->unknown_fields, (std::vector<std::string>{"extra"}));
  EXPECT_TRUE(CheckPlaceholders(*s, 2, 1).ok());
}

TEST(SampleJsonTest, PlaceholderCountsAgainstMembers) {
  SampleJsonOptions o;
  o.image_placeholder_id = 100;
  auto two = ParseSampleJson(R"({"schema": 2, "input_ids": [100, 1, 100]})", o);
  ASSERT_TRUE(two.ok());
  for (size_t images : {1, 3}) {
    absl::Status st = CheckPlaceholders(*two, images, 0);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << images;
    EXPECT_NE(st.message().find("2 image placeholders"), std::string::npos) << st;
  }
  // A placeholder id in the text of a schema-1 document.
  auto plain = ParseSampleJson(R"({"input_ids": [5, 100, 6]})", o);
  ASSERT_TRUE(plain.ok());
  absl::Status st = CheckPlaceholders(*plain, 1, 0);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("input_ids[1] is the image placeholder id"), std::string::npos) << st;
  // No placeholder id known: nothing looked for.
  auto unknown = ParseSampleJson(R"({"schema": 2, "input_ids": [100]})");
  ASSERT_TRUE(unknown.ok());
  EXPECT_TRUE(unknown->image_positions.empty());
}

TEST(SampleJsonTest, BadTrainedSpansAreRefused) {
  for (auto [json, what] : {
           std::pair{R"({"schema": 2, "input_ids": [1, 2], "trained": [[0, 3]]})", "outside the 2"},
           {R"({"schema": 2, "input_ids": [1, 2], "trained": [[2, 1]]})", "outside"},
           {R"({"schema": 2, "input_ids": [1, 2, 3], "trained": [[0, 2], [1, 3]]})", "overlapping"},
           {R"({"schema": 2, "input_ids": [1, 2, 3], "trained": [[2, 3], [0, 1]]})", "sorted"},
           {R"({"schema": 2, "input_ids": [1], "trained": [[0]]})", "not a [begin, end]"},
           {R"({"schema": 2, "input_ids": [1], "trained": [[-1, 1]]})", "not a [begin, end]"},
           {R"({"schema": 2, "input_ids": [1], "trained": 3})", "not a list"},
       }) {
    auto s = ParseSampleJson(json);
    ASSERT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << json;
    EXPECT_NE(s.status().message().find(what), std::string::npos) << s.status();
  }
}

TEST(SampleJsonTest, BadDocuments) {
  for (auto [json, what] : {
           std::pair{"", "invalid JSON"},
           {"[1, 2]", "not a JSON object"},
           {R"({"input_ids": [1, 2)", "invalid JSON"},
           {"{} trailing", "invalid JSON"},
           {R"({"schema": 3, "input_ids": []})", "schemas 1 and 2"},
           {R"({"schema": 2})", "no \"input_ids\""},
           {R"({"schema": 2, "input_ids": [], "source": 5})", "\"source\""},
           {R"({"schema": 2, "input_ids": [], "meta": [1]})", "\"meta\""},
           {R"({"input_ids": [1, -3]})", "input_ids[1] is -3, outside"},
           {R"({"input_ids": [1, 2, 3.5]})", "input_ids[2] is 3.5, not an integer"},
           {R"({"num_tokens": 1.5})", "not a token count"},
       }) {
    auto s = ParseSampleJson(json);
    ASSERT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << json;
    EXPECT_NE(s.status().message().find(what), std::string::npos) << s.status();
  }
  // An id beyond the vocabulary: OUT_OF_RANGE.
  SampleJsonOptions vocab;
  vocab.vocab_size = 100;
  auto past = ParseSampleJson(R"({"input_ids": [1, 100]})", vocab);
  ASSERT_EQ(past.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(past.status().message().find("input_ids[1] is 100, outside the vocabulary [0, 100)"),
            std::string::npos);
  // Deep nesting is refused, not recursed into.
  const std::string deep = "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  auto d = ParseSampleJson(deep);
  ASSERT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(d.status().message().find("nested deeper"), std::string::npos) << d.status();
  // meta over its bound.
  SampleJsonOptions o;
  o.max_meta_bytes = 8;
  auto big = ParseSampleJson(R"({"schema": 2, "input_ids": [], "meta": {"k": "0123456789"}})", o);
  ASSERT_EQ(big.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(big.status().message().find("over the limit of 8"), std::string::npos);
}

// Forms at the edges of what a reader may do differently: each read as the
// nlohmann reader reads it (the refusal messages are its words).
TEST(SampleJsonTest, EdgeForms) {
  // A repeated key: the last value, named once at its first place.
  auto dup = ParseSampleJson(R"({"x": 1, "input_ids": [1], "input_ids": [2, 3], "x": 2})");
  ASSERT_TRUE(dup.ok()) << dup.status();
  EXPECT_EQ(dup->input_ids, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(dup->unknown_fields, (std::vector<std::string>{"x"}));
  // "-0": a token id 0, but not an unsigned span bound, schema or count.
  auto zero = ParseSampleJson(R"({"input_ids": [-0, 1], "text": "2020-01"})");
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->input_ids, (std::vector<int32_t>{0, 1}));
  auto spans = ParseSampleJson(R"({"schema": 2, "input_ids": [1, 2], "trained": [[0, 1]]})");
  ASSERT_TRUE(spans.ok()) << spans.status();
  EXPECT_EQ(spans->trained, (Spans{{0, 1}}));
  for (const char* json : {R"({"schema": 2, "input_ids": [1], "trained": [[-0, 1]]})",
                           R"({"schema": -0, "input_ids": [1]})", R"({"num_tokens": -0})"}) {
    EXPECT_EQ(ParseSampleJson(json).status().code(), absl::StatusCode::kDataLoss) << json;
  }
  // A byte order mark is skipped; numbers past 64 bits are floats, fine in
  // the user's fields and refused as ids.
  auto bom = ParseSampleJson("\xEF\xBB\xBF{\"input_ids\": [7]}");
  ASSERT_TRUE(bom.ok()) << bom.status();
  EXPECT_EQ(bom->input_ids, (std::vector<int32_t>{7}));
  auto wide = ParseSampleJson(R"({"input_ids": [1], "x": 123456789012345678901234567890})");
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(wide->unknown_fields, (std::vector<std::string>{"x"}));
  EXPECT_EQ(ParseSampleJson(R"({"input_ids": [18446744073709551615]})").status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ParseSampleJson(R"({"input_ids": [1e2]})").status().code(),
            absl::StatusCode::kDataLoss);
  // Strings: a lone surrogate or a raw control character is not JSON.
  for (std::string json :
       {std::string(R"({"text": "\udc00"})"), std::string("{\"text\": \"a\x01\"}"),
        std::string(R"({"text": "\x"})")}) {
    auto s = ParseSampleJson(json);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << json;
    EXPECT_NE(s.status().message().find("invalid JSON"), std::string::npos) << s.status();
  }
  // meta's compact form: escapes and numbers as the reference writes them.
  auto meta = ParseSampleJson(
      R"({"schema": 2, "input_ids": [], "meta": {"a": 1e2, "b": "\u00e9\u0001\/", "c": -0,)"
      R"( "d": 1.10, "e": {"z": [], "y": {}}, "a2": 1, "a2": 2}})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->meta,
            "{\"a\":100.0,\"b\":\"\xC3\xA9\\u0001/\",\"c\":0,\"d\":1.1,\"e\":{\"z\":[],\"y\":{}},"
            "\"a2\":2}");
  // Nesting: max_depth levels below the document's object are read.
  for (int levels : {62, 63, 64, 65, 66}) {
    const std::string json = "{\"input_ids\": [1], \"x\": " + std::string(levels, '[') + "1" +
                             std::string(levels, ']') + "}";
    auto s = ParseSampleJson(json);
    EXPECT_EQ(s.ok(), levels <= 64 - 1) << levels << " " << s.status();
  }
}

TEST(SampleJsonTest, DatasetManifest) {
  auto m = ParseDatasetManifest(R"({"format": "tutti-dataset", "schema": 2,
      "tokenizer": {"kind": "sentencepiece", "vocab_size": 1006},
      "placeholders": {"image": 1001, "audio": 1004},
      "markers": {"vision_start": 1000, "image_pad": 1001, "vision_end": 1002}})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->schema, 2);
  EXPECT_EQ(m->vocab_size, 1006u);
  EXPECT_EQ(m->image_placeholder_id, 1001);
  EXPECT_EQ(m->audio_placeholder_id, 1004);
  EXPECT_EQ(m->markers.at("vision_end"), 1002);
  EXPECT_FALSE(ParseDatasetManifest(R"({"schema": 2})").ok());
  auto bad = ParseDatasetManifest(R"({"format": "tutti-dataset", "placeholders": {"image": -1}})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("placeholders.image"), std::string::npos);
}

}  // namespace
}  // namespace tutti
