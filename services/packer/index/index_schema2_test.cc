// Schema-2 samples (interleaved: one placeholder id per image at its place)
// through the index builder: their text tokens, and what it refuses.
#include <map>
#include <string>
#include <vector>

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
  // Where each run goes: image 0 after 1 text token, image 1 after 3, the
  // clip after 4 (members in the index: 0.jpg, 0.wav, 1.png).
  ASSERT_TRUE(ix.has_media_positions());
  const uint32_t m0 = ix.media_begin(0);
  EXPECT_EQ(ix.media_position(0, m0), 1u);
  EXPECT_EQ(ix.media_position(0, m0 + 1), 6u);
  EXPECT_EQ(ix.media_position(0, m0 + 2), 4u);
  std::vector<MediaPlace> order;
  ix.MediaOrder(0, &order);
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0].media, m0);
  EXPECT_EQ(order[0].text_at, 1u);
  EXPECT_EQ(order[1].media, m0 + 2);
  EXPECT_EQ(order[1].text_at, 3u);
  EXPECT_EQ(order[2].media, m0 + 1);
  EXPECT_EQ(order[2].text_at, 4u);
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

// Placeholder positions as the writer takes them: all of a sample's media
// or none, each kind in member order, none shared, within the text; an
// index whose placeholders all lead records none (and keeps its identity).
TEST(IndexSchema2Test, PlaceholderPositionsAreCheckedAndOnlyRecordedWhereTheyMatter) {
  auto media = [](int64_t a, int64_t b) {
    std::vector<MemberInput> m(2);
    m[0].kind = m[1].kind = MemberKind::kJpeg;
    m[0].ext = "0.jpg";
    m[1].ext = "1.jpg";
    for (auto& x : m) x.offset = 100, x.size = 10, x.width = x.height = 32;
    m[0].placeholder_at = a;
    m[1].placeholder_at = b;
    return m;
  };
  const MemberInput json{MemberKind::kJson, "json", 0, 50};
  IndexWriter w;
  ASSERT_TRUE(w.AddShard("a.tar", 1000, 0).ok());
  EXPECT_FALSE(w.AddSample("part", 4, &json, media(2, -1)).ok());
  EXPECT_FALSE(w.AddSample("order", 4, &json, media(3, 1)).ok());
  EXPECT_FALSE(w.AddSample("past", 4, &json, media(0, 6)).ok());  // 5 text tokens before it
  ASSERT_TRUE(w.AddSample("lead", 4, &json, media(0, 1)).ok());
  ASSERT_TRUE(w.AddSample("none", 4, &json, media(-1, -1)).ok());
  IndexWriter plain;
  ASSERT_TRUE(plain.AddShard("a.tar", 1000, 0).ok());
  ASSERT_TRUE(plain.AddSample("lead", 4, &json, media(-1, -1)).ok());
  ASSERT_TRUE(plain.AddSample("none", 4, &json, media(-1, -1)).ok());
  auto a = Index::FromString(w.Finish(), "a.idx");
  auto b = Index::FromString(plain.Finish(), "b.idx");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE((*a)->has_media_positions());
  EXPECT_EQ((*a)->content_id(), (*b)->content_id());
  ASSERT_TRUE(w.AddSample("inside", 4, &json, media(1, 4)).ok());
  auto c = Index::FromString(w.Finish(), "c.idx");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->has_media_positions());
  EXPECT_EQ((*c)->media_position(2, 5), 4u);
  EXPECT_EQ((*c)->media_position(0, 1), 1u);
  // A copy keeps them.
  IndexWriter copy;
  ASSERT_TRUE(copy.CopyShard(**c, 0).ok());
  EXPECT_EQ(copy.Finish(), w.Finish());
}

}  // namespace
}  // namespace tutti::packer
