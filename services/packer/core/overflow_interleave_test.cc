// The overflow policy over interleaved (schema-2) documents: split and
// truncate follow the token stream, runs where their placeholders are, and
// never cut a run; a truncated document's images past the cut are not
// planned at all (no encoder phase holds them).
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/packer/core/overflow.h"
#include "services/packer/core/plan_check.h"
#include "services/packer/core/planner.h"
#include "services/packer/load_job.h"
#include "services/packer/plan_proto.h"
#include "services/packer/testing/jobs.h"

namespace tutti::packer {
namespace {

// Which piece holds each element of the token stream (text tokens and runs
// in order); -1 where none does. Checks on the way that no piece holds a
// run in part (a run is one element) and that the pieces' counts add up.
std::vector<int> PieceOfEachElement(uint32_t text_tokens, const DocumentLayout& doc,
                                    const std::vector<DocPiece>& pieces) {
  std::vector<int> out;
  uint32_t r = 0, t = 0;
  auto piece_of = [&](bool run, uint32_t i) {
    for (size_t p = 0; p < pieces.size(); ++p) {
      const DocPiece& q = pieces[p];
      if (run ? (i >= q.first_run && i < q.first_run + q.runs)
              : (i >= q.text_begin && i < q.text_begin + q.text_tokens)) {
        return static_cast<int>(p);
      }
    }
    return -1;
  };
  while (r < doc.runs.size() || t < text_tokens) {
    if (r < doc.runs.size() && doc.text_at[r] == t) {
      out.push_back(piece_of(true, r++));
    } else {
      out.push_back(piece_of(false, t++));
    }
  }
  return out;
}

// A conversation: 100 text tokens (system prompt and the first turn), an
// image in the second user turn, 600 more, a second image in the third
// turn, 200 more. Each image's run is 1,227 tokens (1,225 + its markers).
DocumentLayout Conversation() {
  DocumentLayout doc;
  doc.images = 2;
  doc.Add(1227, 100, 0);
  doc.Add(1227, 700, 1);
  return doc;
}

TEST(OverflowInterleaveTest, TruncateKeepsThePrefixAndDropsTheImagesPastTheCut) {
  std::vector<DocPiece> p;
  ASSERT_EQ(ShapeDocumentStream(900, Conversation(), 2048, LongDocuments::kTruncate, &p),
            LongDocOutcome::kTruncated);
  ASSERT_EQ(p.size(), 1u);
  // The text before the first image, its run, the text up to the second
  // image: 100 + 1227 + 600 = 1927; the second run would cross the cut.
  EXPECT_EQ(p[0].first_run, 0u);
  EXPECT_EQ(p[0].runs, 1u);
  EXPECT_EQ(p[0].text_begin, 0u);
  EXPECT_EQ(p[0].text_tokens, 700u);
  EXPECT_EQ(p[0].tokens, 1927u);
  // A cut inside the text after the first image keeps that much of it.
  ASSERT_EQ(ShapeDocumentStream(900, Conversation(), 1500, LongDocuments::kTruncate, &p),
            LongDocOutcome::kTruncated);
  EXPECT_EQ(p[0].runs, 1u);
  EXPECT_EQ(p[0].text_tokens, 1500u - 1227);
  // A cut inside the first run keeps the text before it.
  ASSERT_EQ(ShapeDocumentStream(900, Conversation(), 1000, LongDocuments::kTruncate, &p),
            LongDocOutcome::kTruncated);
  EXPECT_EQ(p[0].runs, 0u);
  EXPECT_EQ(p[0].text_tokens, 100u);
  EXPECT_EQ(p[0].tokens, 100u);
}

TEST(OverflowInterleaveTest, SplitFallsBetweenRunsAndEachPieceHoldsItsRange) {
  std::vector<DocPiece> p;
  ASSERT_EQ(ShapeDocumentStream(900, Conversation(), 2048, LongDocuments::kSplit, &p),
            LongDocOutcome::kSplit);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(std::tie(p[0].first_run, p[0].runs, p[0].text_begin, p[0].text_tokens, p[0].tokens),
            std::make_tuple(0u, 1u, 0u, 700u, 1927u));
  EXPECT_EQ(std::tie(p[1].first_run, p[1].runs, p[1].text_begin, p[1].text_tokens, p[1].tokens),
            std::make_tuple(1u, 1u, 700u, 200u, 1427u));
  // A run longer than seq_len cannot be placed whole: skipped.
  EXPECT_EQ(ShapeDocumentStream(900, Conversation(), 1200, LongDocuments::kSplit, &p),
            LongDocOutcome::kSkipped);
}

// Random interleaved documents: the pieces hold every element once, in
// order (each piece one contiguous stretch of the stream), none longer than
// seq_len; truncate keeps a prefix. Documents whose runs lead are shaped as
// ShapeDocument shapes them.
TEST(OverflowInterleaveTest, RandomDocumentsArePiecesOfTheirStreamInOrder) {
  std::mt19937 rng(29);
  for (int iter = 0; iter < 3000; ++iter) {
    SCOPED_TRACE(iter);
    const uint32_t seq_len = 64 + rng() % 512;
    const uint32_t text = rng() % 1500;
    const uint32_t n = rng() % 6;
    const bool lead = rng() % 4 == 0;
    DocumentLayout doc;
    std::vector<uint32_t> at;
    for (uint32_t k = 0; k < n; ++k) at.push_back(lead ? 0 : rng() % (text + 1));
    std::sort(at.begin(), at.end());
    for (uint32_t k = 0; k < n; ++k) doc.Add(3 + rng() % seq_len, at[k], k);
    doc.images = n;
    for (const LongDocuments policy : {LongDocuments::kSplit, LongDocuments::kTruncate}) {
      std::vector<DocPiece> pieces;
      const LongDocOutcome o = ShapeDocumentStream(text, doc, seq_len, policy, &pieces);
      if (lead) {
        std::vector<DocPiece> old;
        ASSERT_EQ(o, ShapeDocument(text, doc.runs, seq_len, policy, &old));
        ASSERT_EQ(pieces.size(), old.size());
        for (size_t p = 0; p < old.size(); ++p) {
          EXPECT_EQ(std::tie(pieces[p].first_run, pieces[p].runs, pieces[p].text_begin,
                             pieces[p].text_tokens, pieces[p].tokens),
                    std::tie(old[p].first_run, old[p].runs, old[p].text_begin, old[p].text_tokens,
                             old[p].tokens));
        }
      }
      if (o == LongDocOutcome::kSkipped) continue;
      const std::vector<int> owner = PieceOfEachElement(text, doc, pieces);
      int last = 0;
      bool ended = false;
      for (size_t e = 0; e < owner.size(); ++e) {
        if (owner[e] < 0) {
          // Only truncate leaves elements out, and only a suffix.
          ASSERT_EQ(o, LongDocOutcome::kTruncated) << e;
          ended = true;
          continue;
        }
        ASSERT_FALSE(ended) << "element " << e << " after the cut";
        ASSERT_GE(owner[e], last) << e;
        ASSERT_LE(owner[e], last + 1) << e;
        last = owner[e];
      }
      uint64_t held = 0;
      for (const DocPiece& p : pieces) {
        uint64_t tokens = p.text_tokens;
        for (uint32_t r = p.first_run; r < p.first_run + p.runs; ++r) tokens += doc.runs[r];
        EXPECT_EQ(tokens, p.tokens);
        EXPECT_LE(p.tokens, seq_len);
        if (text + n > 0) EXPECT_GT(p.tokens, 0u);
        held += p.runs + p.text_tokens;
      }
      if (o == LongDocOutcome::kSplit) EXPECT_EQ(held, owner.size());
    }
  }
}

// 400 samples in 4 shards: text-only ones of 300 tokens, and every 4th a
// conversation as above (1000x1000 images: 1,225 LLM tokens each at 1 MP)
// whose placeholders sit at input_ids 100 and 701.
std::shared_ptr<const Index> ConversationIndex() {
  IndexWriter w;
  w.SetSourceDir("conversations");
  for (uint32_t s = 0; s < 400; ++s) {
    if (s % 100 == 0) {
      EXPECT_TRUE(w.AddShard(absl::StrCat("c-", s / 100, ".tar"), 1 << 30, 0).ok());
    }
    const bool vl = s % 4 == 3;
    const uint32_t text = vl ? 900 : 300;
    const uint64_t base = uint64_t{s % 100} << 20;
    MemberInput json{MemberKind::kJson, "json", base + 512, uint64_t{text} * 6 + 16};
    std::vector<MemberInput> media;
    for (uint32_t k = 0; vl && k < 2; ++k) {
      MemberInput m;
      m.kind = MemberKind::kJpeg;
      m.ext = absl::StrCat(k, ".jpg");
      m.width = m.height = 1000;
      m.offset = base + 100000 + k * 200000;
      m.size = 100000;
      m.placeholder_at = k == 0 ? 100 : 701;
      media.push_back(m);
    }
    EXPECT_TRUE(w.AddSample(absl::StrCat("k", s), text, &json, media).ok());
  }
  auto ix = Index::FromString(w.Finish(), "conversations.idx");
  EXPECT_TRUE(ix.ok()) << ix.status();
  return *ix;
}

std::string ConversationConfig(const std::string& policy, bool post) {
  return absl::StrCat(R"pb(
                        seed: 3
                        world_size: 4
                        ranks_per_node: 2
                        batch {
                          text_samples_per_step: 12
                          vl_samples_per_step: 2
                          grad_accum: 2
                          text_micro_batch: 2
                          vl_micro_batch: 1
                          text_vl_ratio: "2:1"
                        }
                        curriculum { start_step: 0 max_pixels: 1003520 seq_len: 2048 }
                        overflow { long_documents: ')pb",
                      policy, "' }", post ? " post_balancing { enabled: true }" : "");
}

// The plan of each step: every conversation truncated before its second
// image (planned images = the images its document lists = 1, and no
// encoder phase holds the dropped one), or split into a piece with the
// first image and the text up to the second, and one with the second image
// and the rest; what the encoders encode is what the documents list.
TEST(OverflowInterleaveTest, PlansOfTruncatedAndSplitConversations) {
  const auto index = ConversationIndex();
  for (const bool post : {false, true}) {
    for (const std::string policy : {"truncate", "split"}) {
      SCOPED_TRACE(absl::StrCat(policy, post ? ", post-balancing" : ""));
      auto job = testing::MakeJob(ConversationConfig(policy, post), index);
      ASSERT_TRUE(job.ok()) << job.status();
      Planner planner(*job);
      uint32_t conversations = 0;
      for (uint64_t step = 0; step < 10; ++step) {
        StepPlanData d;
        ASSERT_TRUE(planner.Plan(step, &d).ok());
        ASSERT_TRUE(CheckPlannedStep(d, {}).ok()) << CheckPlannedStep(d, {});
        v1::StepPlan plan;
        ASSERT_TRUE(BuildStepPlan(**job, d, {}, &plan).ok());
        // (sample, image) pairs listed by documents and by encoder phases.
        std::multiset<std::pair<uint64_t, uint32_t>> listed, encoded;
        for (const auto& rank : plan.ranks()) {
          for (const auto& enc : rank.encoders()) {
            for (const auto& im : enc.images()) encoded.emplace(im.sample_id(), im.image_index());
          }
          for (const auto& mb : rank.micro_batches()) {
            for (const auto& seq : mb.sequences()) {
              for (const auto& doc : seq.docs()) {
                for (const auto& im : doc.images())
                  listed.emplace(doc.sample_id(), im.image_index());
                if (doc.images_size() == 0 && doc.pieces() == 0) continue;
                ++conversations;
                if (policy == "truncate") {
                  EXPECT_TRUE(doc.truncated());
                  ASSERT_EQ(doc.images_size(), 1);
                  EXPECT_EQ(doc.images(0).image_index(), 0u);
                  EXPECT_EQ(doc.images(0).llm_tokens(), 1225u);
                  EXPECT_EQ(doc.length(), 1927u);
                  EXPECT_EQ(doc.encoder_tokens(), 1225u);
                  EXPECT_EQ(doc.text_begin(), 0u);
                } else {
                  ASSERT_EQ(doc.pieces(), 2u);
                  ASSERT_EQ(doc.images_size(), 1);
                  EXPECT_EQ(doc.images(0).image_index(), doc.piece());
                  EXPECT_EQ(doc.length(), doc.piece() == 0 ? 1927u : 1427u);
                  EXPECT_EQ(doc.text_begin(), doc.piece() == 0 ? 0u : 700u);
                }
              }
            }
          }
        }
        EXPECT_EQ(listed, encoded) << "step " << step;
        for (const auto& [sample, image] : encoded) {
          if (policy == "truncate") EXPECT_EQ(image, 0u) << "sample " << sample;
        }
      }
      EXPECT_GE(conversations, 20u);
    }
  }
}

// An index without placeholder positions (one built before they existed,
// or of schema-1 samples) plans as before: the runs lead.
TEST(OverflowInterleaveTest, MediaOrderWithoutPositionsLeadsWithTheRuns) {
  IndexWriter w;
  ASSERT_TRUE(w.AddShard("a.tar", 1 << 30, 0).ok());
  MemberInput json{MemberKind::kJson, "json", 0, 100};
  std::vector<MemberInput> media(3);
  media[0].kind = MemberKind::kJpeg, media[0].ext = "0.jpg";
  media[1].kind = MemberKind::kWav, media[1].ext = "0.wav", media[1].audio_ms = 1000;
  media[2].kind = MemberKind::kPng, media[2].ext = "1.png";
  for (auto& m : media) m.offset = 1000, m.size = 10, m.width = m.height = 100;
  media[1].width = media[1].height = 0;
  ASSERT_TRUE(w.AddSample("k0", 50, &json, media).ok());
  // The same with placeholders: the clip first, then image 0, then image 1.
  media[1].placeholder_at = 3;
  media[0].placeholder_at = 10;
  media[2].placeholder_at = 11;
  ASSERT_TRUE(w.AddSample("k1", 50, &json, media).ok());
  auto ix = Index::FromString(w.Finish(), "order.idx");
  ASSERT_TRUE(ix.ok()) << ix.status();
  ASSERT_TRUE((*ix)->has_media_positions());
  std::vector<MediaPlace> order;
  (*ix)->MediaOrder(0, &order);
  ASSERT_EQ(order.size(), 3u);
  // Images 0 and 1 (members 0 and 2), then the clip, all before the text.
  EXPECT_EQ(std::tie(order[0].media, order[0].text_at), std::make_tuple(0u, 0u));
  EXPECT_EQ(std::tie(order[1].media, order[1].text_at), std::make_tuple(2u, 0u));
  EXPECT_EQ(std::tie(order[2].media, order[2].text_at), std::make_tuple(1u, 0u));
  (*ix)->MediaOrder(1, &order);
  EXPECT_EQ(std::tie(order[0].media, order[0].text_at, order[0].image),
            std::make_tuple(4u, 3u, false));
  EXPECT_EQ(std::tie(order[1].media, order[1].text_at, order[1].index),
            std::make_tuple(3u, 9u, 0u));
  EXPECT_EQ(std::tie(order[2].media, order[2].text_at, order[2].index),
            std::make_tuple(5u, 9u, 1u));
}

// An index built with placeholder ids by a tutti that did not record
// where they sit is refused at job load, saying to re-run tutti index.
TEST(OverflowInterleaveTest, AnIndexOfPlaceholdersWithoutPositionsIsRefused) {
  for (const std::string options : {"vocab_size=0",
                                    "vocab_size=0 image_placeholder_id=5 "
                                    "audio_placeholder_id=-1",
                                    "vocab_size=0 image_placeholder_id=5 audio_placeholder_id=-1 "
                                    "placeholder_positions=1"}) {
    IndexWriter w;
    w.SetSourceDir("/data/chat");
    w.AddMeta("options", options);
    ASSERT_TRUE(w.AddShard("a.tar", 1000, 0).ok());
    const MemberInput json{MemberKind::kJson, "json", 0, 50};
    ASSERT_TRUE(w.AddSample("k", 4, &json, {}).ok());
    auto ix = Index::FromString(w.Finish(), "chat.idx");
    ASSERT_TRUE(ix.ok());
    const absl::Status s = CheckPlaceholderPositions(**ix, "chat.idx");
    if (options.find("image_placeholder_id") != std::string::npos &&
        options.find("positions") == std::string::npos) {
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << options;
      EXPECT_NE(s.message().find("re-run `tutti index --source /data/chat --out chat.idx`"),
                std::string::npos)
          << s;
    } else {
      EXPECT_TRUE(s.ok()) << options << ": " << s;
    }
  }
}

}  // namespace
}  // namespace tutti::packer
