// Schema-2 samples (interleaved: one placeholder id per image at its place)
// through the index builder: their text tokens, and what it refuses.
#include <map>
#include <string>

#include "common/tar.h"
#include "gtest/gtest.h"
#include "services/packer/index/index.h"
#include "services/packer/index/index_builder.h"
#include "services/packer/index/shard_test_util.h"

namespace tutti::packer {
namespace {

using testing::Encode;
using testing::TempDir;
using testing::Wav;

constexpr int kImage = 1001, kAudio = 1004;

std::string Doc(const std::string& ids, const std::string& extra = "") {
  return "{\"schema\": 2, \"input_ids\": [" + ids + "]" + extra + "}";
}

TEST(IndexSchema2Test, PlaceholdersAreCheckedAndNotCountedAsText) {
  TarWriter t;
  // Two images at different places, a clip, spans: 5 text tokens.
  t.Add("ok.json", Doc("1, 1001, 2, 3, 1001, 4, 1004, 5", R"(, "trained": [[5, 8]])"));
  t.Add("ok.0.jpg", Encode(".jpg", 64, 48));
  t.Add("ok.1.png", Encode(".png", 30, 20));
  t.Add("ok.0.wav", Wav(16000, 1600));
  t.Add("text.json", Doc("7, 8, 9", R"(, "labels": [1], "extra": {})"));  // text only
  t.Add("fewer.json", Doc("1, 1001, 2"));  // one placeholder, two images
  t.Add("fewer.0.jpg", Encode(".jpg", 64, 48));
  t.Add("fewer.1.jpg", Encode(".jpg", 64, 48));
  t.Add("more.json", Doc("1001, 1, 1001"));  // two placeholders, one image
  t.Add("more.0.jpg", Encode(".jpg", 64, 48));
  t.Add("intext.json", Doc("1, 1001, 2"));  // a placeholder in a text-only sample
  t.Add("noclip.json", Doc("1, 2", ""));    // a clip without its placeholder
  t.Add("noclip.0.wav", Wav(16000, 1600));
  t.Add("plain.json", R"({"input_ids": [5, 1001, 6]})");  // schema 1 with one
  t.Add("plain.jpg", Encode(".jpg", 64, 48));
  t.Add("span.json", Doc("1, 2", R"(, "trained": [[1, 3]])"));  // past the end
  TempDir dir;
  dir.Write("s.tar", t.Finish());
  IndexBuildOptions o;
  o.source_dir = dir.path();
  o.image_placeholder_id = kImage;
  o.audio_placeholder_id = kAudio;
  IndexBuildReport report;
  auto bytes = BuildIndex(o, &report, nullptr);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto index = Index::FromString(*bytes, "built.idx");
  ASSERT_TRUE(index.ok()) << index.status();
  const Index& ix = **index;
  std::string all;
  for (const auto& e : report.skipped_examples) all += e + "\n";
  ASSERT_EQ(ix.num_samples(), 2u) << all;
  EXPECT_EQ(ix.key(0), "ok");
  EXPECT_EQ(ix.text_tokens(0), 5u);
  EXPECT_EQ(ix.media_end(0) - ix.media_begin(0), 3u);
  EXPECT_EQ(ix.key(1), "text");
  EXPECT_EQ(ix.text_tokens(1), 3u);
  EXPECT_EQ(report.skipped["placeholder_mismatch"], 5u) << all;
  EXPECT_EQ(report.skipped["bad_json"], 1u) << all;
  // Fields the schema does not define: counted and named, not refused.
  EXPECT_EQ(report.unknown_json_members, 1u);
  EXPECT_EQ(report.unknown_json_fields,
            (std::map<std::string, uint64_t>{{"extra", 1}, {"labels", 1}}));
  for (const char* want : {
           "s.tar:fewer: fewer.json: input_ids hold 1 image placeholders but the sample has 2",
           "s.tar:more: more.json: input_ids hold 2 image placeholders but the sample has 1",
           "s.tar:intext: intext.json: input_ids hold 1 image placeholders but the sample has 0",
           "s.tar:noclip: noclip.json: input_ids hold 0 audio placeholders but the sample has 1",
           "s.tar:plain: plain.json: input_ids[1] is the image placeholder id",
           "s.tar:span: span.json: trained[0] is [1, 3], outside the 2 input_ids",
       }) {
    EXPECT_NE(all.find(want), std::string::npos) << want << "\n" << all;
  }
}

TEST(IndexSchema2Test, WithoutPlaceholderIdsAnImageSampleSaysWhereTheyComeFrom) {
  TarWriter t;
  t.Add("a.json", Doc("1, 1001, 2"));
  t.Add("a.0.jpg", Encode(".jpg", 64, 48));
  t.Add("b.json", Doc("1, 2"));
  TempDir dir;
  dir.Write("s.tar", t.Finish());
  IndexBuildOptions o;
  o.source_dir = dir.path();
  IndexBuildReport report;
  auto bytes = BuildIndex(o, &report, nullptr);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(report.samples, 1u);
  EXPECT_EQ(report.skipped["placeholder_mismatch"], 1u);
  ASSERT_FALSE(report.skipped_examples.empty());
  EXPECT_NE(report.skipped_examples[0].find("tutti_dataset.json"), std::string::npos)
      << report.skipped_examples[0];
}

}  // namespace
}  // namespace tutti::packer
