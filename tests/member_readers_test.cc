// The index and the stager read a sample's k.json alike: what the index
// counts is what the stager serves, for every document either accepts.
#include <string>

#include "common/media_header.h"
#include "gtest/gtest.h"
#include "services/packer/index/text_tokens.h"
#include "services/stager/decode/batch_layout.h"
#include "services/stager/decode/members.h"

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

// A WAV clip: `len` declared in the data chunk, `have` bytes of it present.
std::string Wav(uint16_t format, uint16_t bits, uint16_t channels, uint16_t block, uint32_t len,
                uint32_t have) {
  auto le = [](std::string* out, uint32_t v, int n) {
    for (int i = 0; i < n; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
  };
  std::string w = "RIFF";
  le(&w, 36 + len, 4);
  w += "WAVEfmt ";
  le(&w, 16, 4);
  le(&w, format, 2);
  le(&w, channels, 2);
  le(&w, 16000, 4);
  le(&w, 16000 * block, 4);
  le(&w, block, 2);
  le(&w, bits, 2);
  w += "data";
  le(&w, len, 4);
  return w + std::string(have, '\0');
}

TEST(MemberReadersTest, WhatTheIndexAcceptsOfAWavTheStagerDecodes) {
  struct Case {
    const char* what;
    std::string wav;
    bool ok;
  };
  for (const Case& c : {
           Case{"16-bit PCM", Wav(1, 16, 1, 2, 3200, 3200), true},
           Case{"24-bit stereo PCM", Wav(1, 24, 2, 6, 600, 600), true},
           Case{"float", Wav(3, 32, 1, 4, 400, 400), true},
           Case{"a data chunk past the end", Wav(1, 16, 1, 2, 3200, 100), false},
           Case{"12-bit PCM", Wav(1, 12, 1, 2, 3200, 3200), false},
           Case{"64-bit float", Wav(3, 64, 1, 8, 800, 800), false},
           Case{"a block size unlike the channels'", Wav(1, 16, 2, 2, 3200, 3200), false},
           Case{"no channels", Wav(1, 16, 0, 2, 3200, 3200), false},
       }) {
    auto header = ReadWavHeader(c.wav);
    auto pcm = stager::DecodeWav(c.wav, 16000, 100);
    EXPECT_EQ(header.ok(), c.ok) << c.what << ": " << header.status();
    EXPECT_EQ(pcm.ok(), c.ok) << c.what << ": " << pcm.status();
  }
  // The index reads a header from the member's first bytes.
  const std::string long_clip = Wav(1, 16, 1, 2, 1 << 20, 1 << 20);
  auto head = ReadWavHeader(long_clip.substr(0, 4096), long_clip.size());
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->duration_ms, 32768u);
  EXPECT_FALSE(ReadWavHeader(long_clip.substr(0, 4096), long_clip.size() - 1).ok());
}

}  // namespace
}  // namespace tutti
