#include "services/stager/decode/batch_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "gtest/gtest.h"
#include "services/stager/decode/members.h"
#include "services/stager/test_dataset.h"

namespace tutti::stager {
namespace {

TEST(BatchLayoutTest, ArraysFollowThePlan) {
  auto data = testing::WriteDataset(::testing::TempDir() + "/layout_ds",
                                    {.shards = 1, .samples_per_shard = 3});
  v1::JobInfo job = testing::MakeJob(data, 2, 2);
  v1::StepPlan plan = testing::MakePlan(data, job, 0, {}, 3);
  const PatchifyParams p = PatchifyParams::FromConfig(job.config().vision());
  auto layout = BatchLayout::Build(plan, plan.ranks(1), job.config(), p);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->images().size(), 3u);
  ASSERT_EQ(layout->docs().size(), 3u);
  std::vector<char> seg(layout->total_bytes());
  layout->WriteFixed(seg.data());
  layout->WriteText(seg.data(), 0, {7, 8, 9});
  auto descs = layout->Finalize(seg.data(), {false, true, false}, {false, false, true}, {});
  std::map<std::string, v1::ArrayDesc> by;
  for (auto& d : descs) {
    EXPECT_EQ(d.offset() % 64, 0u) << d.name();
    by[d.name()] = d;
  }
  const auto& im = layout->images();
  EXPECT_EQ(by["pixel_values"].shape(0), im[0].rows + im[2].rows);
  EXPECT_EQ(by["pixel_values"].shape(1), 1176u);
  EXPECT_EQ(by["image_grid_thw"].shape(0), 2u);
  EXPECT_EQ(by["cu_seqlens"].shape(0), 3u);
  const auto& doc = layout->docs()[0];
  const int32_t* ids = reinterpret_cast<const int32_t*>(seg.data() + by["input_ids"].offset());
  EXPECT_EQ(ids[0], 151652);                    // vision_start
  EXPECT_EQ(ids[1], 151655);                    // image_pad
  EXPECT_EQ(ids[doc.text_offset - 1], 151653);  // vision_end
  EXPECT_EQ(ids[doc.text_offset], 7);
  EXPECT_EQ(ids[doc.text_offset + 3], 7);  // fitted by repeating
  const int32_t* cu = reinterpret_cast<const int32_t*>(seg.data() + by["cu_seqlens"].offset());
  EXPECT_EQ(cu[1], static_cast<int32_t>(layout->docs()[0].length));
  EXPECT_EQ(cu[2], static_cast<int32_t>(layout->docs()[0].length + layout->docs()[1].length));
  EXPECT_EQ(by["input_ids"].shape(0), static_cast<uint64_t>(cu[2]));
}

// pixel_values, image_grid_thw and image_sample_ids (hence vit_cu_seqlens)
// lie in the plan's EncoderPhase order, whatever it is and whatever the plan
// version: from plan_version 4 that order groups the images by the rank they
// go to, so the encoder output is the exchange's send buffer as it stands
// (plan.proto Exchange).
TEST(BatchLayoutTest, ImagesLieInTheEncoderPhasesOrder) {
  auto data = testing::WriteDataset(::testing::TempDir() + "/layout_order",
                                    {.shards = 1, .samples_per_shard = 3});
  v1::JobInfo job = testing::MakeJob(data, 2, 2);
  v1::StepPlan plan = testing::MakePlan(data, job, 0, {}, 3);
  const PatchifyParams p = PatchifyParams::FromConfig(job.config().vision());
  auto* images = plan.mutable_ranks(1)->mutable_encoders(0)->mutable_images();
  ASSERT_EQ(images->size(), 3);
  std::reverse(images->begin(), images->end());  // say, the last one goes to rank 0
  images->Mutable(0)->set_llm_rank(0);
  images->Mutable(1)->set_llm_rank(1);
  images->Mutable(2)->set_llm_rank(1);
  auto layout = BatchLayout::Build(plan, plan.ranks(1), job.config(), p);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<char> seg(layout->total_bytes());
  layout->WriteFixed(seg.data());
  auto descs = layout->Finalize(seg.data(), {false, false, false}, {false, false, false}, {});
  std::map<std::string, v1::ArrayDesc> by;
  for (auto& d : descs) by[d.name()] = d;
  const auto* ids = reinterpret_cast<const int64_t*>(seg.data() + by["image_sample_ids"].offset());
  uint64_t row = by["pixel_values"].offset();
  for (int k = 0; k < 3; ++k) {
    const ImageItem& im = layout->images()[k];
    EXPECT_EQ(im.sample_id, images->Get(k).sample_id()) << k;
    EXPECT_EQ(im.llm_rank, images->Get(k).llm_rank()) << k;
    EXPECT_EQ(static_cast<uint64_t>(ids[k]), images->Get(k).sample_id()) << k;
    EXPECT_EQ(im.offset, row) << k;  // back to back, in that order
    row += im.bytes;
  }
}

// A piece of a split document (overflow.long_documents "split") holds only
// A schema-2 document: its image's run where its placeholder is, the text
// around it, and the loss mask 0 outside its trained spans.
TEST(BatchLayoutTest, ASchemaTwoDocumentHasItsImageRunAtItsPlaceholder) {
  auto data = testing::WriteDataset(::testing::TempDir() + "/layout_interleaved",
                                    {.shards = 1, .samples_per_shard = 3});
  v1::JobInfo job = testing::MakeJob(data, 2, 2);
  v1::StepPlan plan = testing::MakePlan(data, job, 0, {}, 3);
  const PatchifyParams p = PatchifyParams::FromConfig(job.config().vision());
  auto layout = BatchLayout::Build(plan, plan.ranks(1), job.config(), p);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const auto& doc = layout->docs()[0];
  ASSERT_EQ(doc.image_count, 1u);
  const uint32_t n = doc.text_offset - 2;  // the image's LLM tokens
  const uint32_t text = doc.text_length;
  ASSERT_GE(text, 3u);
  // input_ids: two text tokens, the placeholder, the rest of the text;
  // trained: the last two text tokens.
  const int32_t pad = static_cast<int32_t>(job.config().vision().image_pad_id());
  std::string ids = "2, 3, " + std::to_string(pad);
  for (uint32_t i = 2; i < text; ++i) ids += ", " + std::to_string(10 + i);
  const std::string json = R"({"schema": 2, "input_ids": [)" + ids + R"(], "trained": [[)" +
                           std::to_string(text - 1) + ", " + std::to_string(text + 1) + "]]}";
  auto parsed = ParseTextMember(json, job.config());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  std::vector<char> seg(layout->total_bytes());
  layout->WriteFixed(seg.data());
  layout->WriteDocument(seg.data(), 0, *parsed);
  auto descs = layout->Finalize(seg.data(), {false, false, false}, {false, false, false}, {});
  std::map<std::string, v1::ArrayDesc> by;
  for (auto& d : descs) by[d.name()] = d;
  ASSERT_EQ(by.count("loss_mask"), 1u);
  ASSERT_EQ(by.count("doc_image_starts"), 1u);
  const int32_t* out = reinterpret_cast<const int32_t*>(seg.data() + by["input_ids"].offset());
  const uint8_t* loss = reinterpret_cast<const uint8_t*>(seg.data() + by["loss_mask"].offset());
  const int32_t* starts =
      reinterpret_cast<const int32_t*>(seg.data() + by["doc_image_starts"].offset());
  EXPECT_EQ(out[0], 2);
  EXPECT_EQ(out[1], 3);
  EXPECT_EQ(out[2], 151652);  // vision_start where the placeholder was
  for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(out[3 + i], pad) << i;
  EXPECT_EQ(out[3 + n], 151653);
  EXPECT_EQ(out[4 + n], 12);  // the text after it
  EXPECT_EQ(out[doc.length - 1], static_cast<int32_t>(10 + text - 1));
  EXPECT_EQ(starts[0], 3);
  // Trained: input_ids [text - 1, text + 1): its last two tokens.
  for (uint32_t t = 0; t < doc.length; ++t) {
    EXPECT_EQ(loss[t], t >= doc.length - 2 ? 1 : 0) << t;
  }
  // The other documents keep the leading layout, every token trained.
  const auto& doc1 = layout->docs()[1];
  EXPECT_EQ(starts[1], 1);
  EXPECT_EQ(out[doc1.token_offset], 151652);
  EXPECT_EQ(loss[doc1.token_offset + doc1.text_offset], 1);
}

// A document whose planned length would cut an image's run (or a piece of a
// split one) keeps the leading layout: every planned image keeps its run.
TEST(BatchLayoutTest, ARunThePlannedLengthWouldCutKeepsTheLeadingLayout) {
  auto data = testing::WriteDataset(::testing::TempDir() + "/layout_cut",
                                    {.shards = 1, .samples_per_shard = 3});
  v1::JobInfo job = testing::MakeJob(data, 2, 2);
  v1::StepPlan plan = testing::MakePlan(data, job, 0, {}, 3);
  const PatchifyParams p = PatchifyParams::FromConfig(job.config().vision());
  auto layout = BatchLayout::Build(plan, plan.ranks(1), job.config(), p);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const auto& doc = layout->docs()[0];
  const int32_t pad = static_cast<int32_t>(job.config().vision().image_pad_id());
  // The placeholder after more text than the document's planned text.
  std::string ids;
  for (uint32_t i = 0; i <= doc.text_length; ++i) ids += std::to_string(20 + i) + ", ";
  ids += std::to_string(pad);
  auto parsed = ParseTextMember(R"({"schema": 2, "input_ids": [)" + ids + "]}", job.config());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  std::vector<char> seg(layout->total_bytes());
  layout->WriteFixed(seg.data());
  layout->WriteDocument(seg.data(), 0, *parsed);
  const int32_t* out = reinterpret_cast<const int32_t*>(seg.data());
  for (const auto& d :
       layout->Finalize(seg.data(), {false, false, false}, {false, false, false}, {})) {
    if (d.name() == "input_ids") out = reinterpret_cast<const int32_t*>(seg.data() + d.offset());
  }
  EXPECT_EQ(out[0], 151652);
  EXPECT_EQ(out[1], pad);
  EXPECT_EQ(out[doc.text_offset], 20);
  EXPECT_EQ(out[doc.length - 1], static_cast<int32_t>(20 + doc.text_length - 1));
}

// the images it lists and the text from its text_begin.
TEST(BatchLayoutTest, APieceOfASplitDocumentHoldsItsPartOfTheText) {
  auto data = testing::WriteDataset(::testing::TempDir() + "/layout_piece",
                                    {.shards = 1, .samples_per_shard = 3});
  v1::JobInfo job = testing::MakeJob(data, 2, 2);
  v1::StepPlan plan = testing::MakePlan(data, job, 0, {}, 3);
  const PatchifyParams p = PatchifyParams::FromConfig(job.config().vision());
  v1::DocSlot* slot =
      plan.mutable_ranks(1)->mutable_micro_batches(0)->mutable_sequences(0)->mutable_docs(0);
  const uint32_t whole = slot->length();
  slot->clear_images();  // the piece after its images: text only
  slot->set_encoder_tokens(0);
  slot->set_length(3);
  slot->set_piece(1);
  slot->set_pieces(2);
  slot->set_text_begin(2);
  auto layout = BatchLayout::Build(plan, plan.ranks(1), job.config(), p);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const auto& doc = layout->docs()[0];
  EXPECT_EQ(doc.text_offset, 0u);
  EXPECT_EQ(doc.text_length, 3u);
  EXPECT_LT(doc.length, whole);
  std::vector<char> seg(layout->total_bytes());
  layout->WriteFixed(seg.data());
  layout->WriteText(seg.data(), 0, {7, 8, 9, 10, 11});
  auto descs = layout->Finalize(seg.data(), {false, false, false}, {false, false, false}, {});
  for (const auto& d : descs) {
    if (d.name() != "input_ids") continue;
    const int32_t* ids = reinterpret_cast<const int32_t*>(seg.data() + d.offset());
    EXPECT_EQ(ids[doc.token_offset], 9);
    EXPECT_EQ(ids[doc.token_offset + 2], 11);
  }
  // A piece naming an image the sample does not have is refused.
  slot->add_images()->set_image_index(7);
  EXPECT_EQ(BatchLayout::Build(plan, plan.ranks(1), job.config(), p).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BatchLayoutTest, InconsistentPlanIsRefused) {
  auto data = testing::WriteDataset(::testing::TempDir() + "/layout_ds2",
                                    {.shards = 1, .samples_per_shard = 2});
  v1::JobInfo job = testing::MakeJob(data, 1, 1);
  v1::StepPlan plan = testing::MakePlan(data, job, 0, {}, 2);
  const PatchifyParams p = PatchifyParams::FromConfig(job.config().vision());
  v1::StepPlan missing = plan;
  missing.clear_samples();
  auto a = BatchLayout::Build(missing, missing.ranks(0), job.config(), p);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("SampleInfo"), std::string::npos);
  v1::StepPlan odd = plan;
  odd.mutable_ranks(0)->mutable_encoders(0)->mutable_images(0)->set_resized_height(30);
  auto b = BatchLayout::Build(odd, odd.ranks(0), job.config(), p);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("patch*merge"), std::string::npos);
}

TEST(BatchLayoutTest, ParsesInputIds) {
  auto ids = ParseInputIds(R"({"text": "x", "input_ids": [1, 22 ,3]})");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 22, 3}));
  // What the index refuses is refused here too (it reads with the same reader).
  EXPECT_EQ(ParseInputIds(R"({"input_ids": [1, -3]})").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseInputIds(R"({"tokens": 5})").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ParseInputIds(R"({"input_ids": [1, 2)").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseInputIds(R"({"input_ids": [1, "a"]})").status().code(),
            absl::StatusCode::kDataLoss);
  // Not JSON at all (a member swapped after indexing): said as such.
  auto binary = ParseInputIds(std::string("\x89PNG\r\n\x1a\n....", 12));
  ASSERT_EQ(binary.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(binary.status().message().find("is not a JSON object"), std::string::npos)
      << binary.status();
}

TEST(BatchLayoutTest, EncoderTokensBelowWhatTheItemsNeedAreRefused) {
  // An image and an audio clip per document: the plan's encoder_tokens can
  // only move the last item's tokens, never below zero. A plan asking for
  // fewer was laid out with the text starting where the encoder tokens are
  // still written, past the document's end (a heap overflow found by
  // fuzz/plan_fuzzer).
  auto data = testing::WriteDataset(::testing::TempDir() + "/layout_ds3",
                                    {.shards = 1, .samples_per_shard = 2, .audio_ms = 500});
  v1::JobInfo job = testing::MakeJob(data, 1, 1);
  v1::StepPlan plan = testing::MakePlan(data, job, 0, {}, 2);
  const PatchifyParams p = PatchifyParams::FromConfig(job.config().vision());
  ASSERT_TRUE(BatchLayout::Build(plan, plan.ranks(0), job.config(), p).ok());
  v1::DocSlot* slot =
      plan.mutable_ranks(0)->mutable_micro_batches(0)->mutable_sequences(0)->mutable_docs(0);
  slot->set_encoder_tokens(1);
  auto layout = BatchLayout::Build(plan, plan.ranks(0), job.config(), p);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument) << layout.status();
  EXPECT_NE(layout.status().message().find("encoder tokens"), std::string::npos) << layout.status();
}

// `plan` as a packer of plan_version 2 writes it: every document lists its
// images with their grids and LLM tokens (DocSlot.images), from the ranks'
// encoder phases (MakePlan encodes each document's image on its own rank).
void ListDocumentImages(v1::StepPlan* plan) {
  for (v1::RankPlan& rp : *plan->mutable_ranks()) {
    rp.set_plan_version(2);
    for (v1::MicroBatch& mb : *rp.mutable_micro_batches()) {
      for (v1::Sequence& seq : *mb.mutable_sequences()) {
        for (v1::DocSlot& doc : *seq.mutable_docs()) {
          for (const v1::ImagePlan& ip : rp.encoders(0).images()) {
            if (ip.sample_id() != doc.sample_id()) continue;
            v1::DocImage* di = doc.add_images();
            di->set_image_index(ip.image_index());
            di->set_grid_t(1);
            di->set_grid_h(ip.grid_h());
            di->set_grid_w(ip.grid_w());
            di->set_llm_tokens(ip.llm_tokens());
          }
        }
      }
    }
  }
}

// From plan_version 2 on the plan's per-document images are the layout: the
// stager does not recompute them behind the plan's back, and a document
// image (or total) that differs from what its own vision config gives is an
// error naming the sample instead of a silent fix-up.
TEST(BatchLayoutTest, DocumentImagesComeFromThePlan) {
  auto data = testing::WriteDataset(::testing::TempDir() + "/layout_docimages",
                                    {.shards = 1, .samples_per_shard = 3});
  v1::JobInfo job = testing::MakeJob(data, 2, 2);
  v1::StepPlan plan = testing::MakePlan(data, job, 0, {}, 3);
  const PatchifyParams p = PatchifyParams::FromConfig(job.config().vision());
  auto old = BatchLayout::Build(plan, plan.ranks(1), job.config(), p);
  ASSERT_TRUE(old.ok()) << old.status();
  ListDocumentImages(&plan);
  auto v2 = BatchLayout::Build(plan, plan.ranks(1), job.config(), p);
  ASSERT_TRUE(v2.ok()) << v2.status();
  ASSERT_EQ(v2->docs().size(), old->docs().size());
  for (size_t d = 0; d < v2->docs().size(); ++d) {
    EXPECT_EQ(v2->docs()[d].text_offset, old->docs()[d].text_offset);
    EXPECT_EQ(v2->docs()[d].length, old->docs()[d].length);
  }

  // The plan's image is 4 tokens larger (a grid the stager's config does not give).
  v1::StepPlan bigger = plan;
  v1::DocSlot* slot =
      bigger.mutable_ranks(1)->mutable_micro_batches(0)->mutable_sequences(0)->mutable_docs(0);
  ASSERT_EQ(slot->images_size(), 1);
  v1::DocImage* di = slot->mutable_images(0);
  di->set_grid_h(di->grid_h() + 2 * p.merge);
  di->set_llm_tokens(di->grid_h() * di->grid_w() / (p.merge * p.merge));
  slot->set_encoder_tokens(slot->encoder_tokens() + di->grid_w() * 2 / p.merge);
  slot->set_length(slot->length() + di->grid_w() * 2 / p.merge);
  auto a = BatchLayout::Build(bigger, bigger.ranks(1), job.config(), p);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
  const std::string sample = "of sample " + std::to_string(slot->sample_id());
  EXPECT_NE(a.status().message().find(sample + " is planned in its document with"),
            std::string::npos)
      << a.status();
  EXPECT_NE(a.status().message().find("disagree on the vision config"), std::string::npos)
      << a.status();

  // Its tokens do not match its own grid.
  v1::StepPlan off_grid = plan;
  slot = off_grid.mutable_ranks(1)->mutable_micro_batches(0)->mutable_sequences(0)->mutable_docs(0);
  slot->mutable_images(0)->set_grid_w(slot->images(0).grid_w() + p.merge);
  EXPECT_EQ(BatchLayout::Build(off_grid, off_grid.ranks(1), job.config(), p).status().code(),
            absl::StatusCode::kInvalidArgument);

  // The document's encoder_tokens are not the sum of its planned images.
  v1::StepPlan total = plan;
  slot = total.mutable_ranks(1)->mutable_micro_batches(0)->mutable_sequences(0)->mutable_docs(0);
  slot->set_encoder_tokens(slot->encoder_tokens() + 1);
  auto b = BatchLayout::Build(total, total.ranks(1), job.config(), p);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
  EXPECT_NE(b.status().message().find("document of sample " + std::to_string(slot->sample_id()) +
                                      " is planned with"),
            std::string::npos)
      << b.status();
  EXPECT_NE(b.status().message().find("its planned images and its audio come to"),
            std::string::npos)
      << b.status();
}

// A mixture source's max_pixels ceiling (SampleInfo.max_pixels) sizes its
// images below the step's: a document's images are checked against it.
TEST(BatchLayoutTest, ASourceCeilingSizesItsDocumentImages) {
  auto data = testing::WriteDataset(::testing::TempDir() + "/layout_ceiling",
                                    {.shards = 1, .samples_per_shard = 3});
  v1::JobInfo job = testing::MakeJob(data, 2, 2);
  v1::StepPlan plan = testing::MakePlan(data, job, 0, {}, 3);
  const PatchifyParams p = PatchifyParams::FromConfig(job.config().vision());
  ListDocumentImages(&plan);
  v1::DocSlot* slot =
      plan.mutable_ranks(1)->mutable_micro_batches(0)->mutable_sequences(0)->mutable_docs(0);
  ASSERT_EQ(slot->images_size(), 1);
  v1::SampleInfo* info = nullptr;
  for (v1::SampleInfo& s : *plan.mutable_samples()) {
    if (s.sample_id() == slot->sample_id()) info = &s;
  }
  ASSERT_NE(info, nullptr);
  const uint64_t ceiling = job.config().vision().min_pixels();
  VisionGeometryOptions geo = GeometryOptions(job.config(), ceiling);
  auto g = SmartResize(info->images(0).height(), info->images(0).width(), geo);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_LT(g->llm_tokens, slot->images(0).llm_tokens()) << "the ceiling must be below the step's";

  // The ceiling without the smaller grid: the plan and the stager disagree.
  v1::StepPlan capped = plan;
  for (v1::SampleInfo& s : *capped.mutable_samples()) {
    if (s.sample_id() == slot->sample_id()) s.set_max_pixels(ceiling);
  }
  auto refused = BatchLayout::Build(capped, capped.ranks(1), job.config(), p);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();

  // The smaller grid with the ceiling: the document holds it.
  v1::DocSlot* c =
      capped.mutable_ranks(1)->mutable_micro_batches(0)->mutable_sequences(0)->mutable_docs(0);
  const uint32_t shrink = c->images(0).llm_tokens() - g->llm_tokens;
  v1::DocImage* di = c->mutable_images(0);
  di->set_grid_h(g->grid_h);
  di->set_grid_w(g->grid_w);
  di->set_llm_tokens(g->llm_tokens);
  c->set_encoder_tokens(c->encoder_tokens() - shrink);
  c->set_length(c->length() - shrink);
  auto held = BatchLayout::Build(capped, capped.ranks(1), job.config(), p);
  ASSERT_TRUE(held.ok()) << held.status();

  // And without the ceiling the smaller grid is refused.
  v1::StepPlan uncapped = capped;
  for (v1::SampleInfo& s : *uncapped.mutable_samples()) s.clear_max_pixels();
  EXPECT_EQ(BatchLayout::Build(uncapped, uncapped.ranks(1), job.config(), p).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A RIFF/WAVE file of 32-bit float samples.
std::string FloatWav(const std::vector<float>& samples, uint16_t channels) {
  auto le = [](std::string* out, uint32_t v, int n) {
    for (int i = 0; i < n; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
  };
  std::string data(samples.size() * 4, '\0');
  std::memcpy(data.data(), samples.data(), data.size());
  std::string w = "RIFF";
  le(&w, static_cast<uint32_t>(36 + data.size()), 4);
  w += "WAVEfmt ";
  le(&w, 16, 4);
  le(&w, 3, 2);
  le(&w, channels, 2);
  le(&w, 8000, 4);
  le(&w, 8000 * 4 * channels, 4);
  le(&w, 4 * channels, 2);
  le(&w, 32, 2);
  w += "data";
  le(&w, static_cast<uint32_t>(data.size()), 4);
  return w + data;
}

TEST(BatchLayoutTest, WavWithNonFiniteSamplesIsRefusedAndLoudStereoStaysFinite) {
  // A NaN or infinite sample would reach the batch and the loss (found by
  // fuzz/wav_decode_fuzzer).
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto pcm = DecodeWav(FloatWav({0.5f, bad, 0.25f, 0.f}, 1), 8000, 4);
    EXPECT_EQ(pcm.status().code(), absl::StatusCode::kDataLoss) << pcm.status();
  }
  // Two channels near the float limit average to a finite value.
  const float big = std::numeric_limits<float>::max();
  auto pcm = DecodeWav(FloatWav({big, big, -big, -big}, 2), 8000, 2);
  ASSERT_TRUE(pcm.ok()) << pcm.status();
  for (float v : *pcm) EXPECT_TRUE(std::isfinite(v)) << v;
}

// Rank 1's first document made a conversation with two images (the second
// a copy of the first's member): k.json t0 t1 <image> t2 t3 t4 t5 <image>
// t6 t7, trained [3, 9). Returns its layout with `edit` applied to its slot,
// and its k.json.
struct Conversation {
  v1::JobInfo job;
  v1::StepPlan plan;
  SampleJson json;
  uint32_t n = 0;  // each image's LLM tokens
};
Conversation MakeConversation(const std::string& dir) {
  Conversation c;
  auto data = testing::WriteDataset(dir, {.shards = 1, .samples_per_shard = 3});
  c.job = testing::MakeJob(data, 2, 2);
  c.plan = testing::MakePlan(data, c.job, 0, {}, 3);
  ListDocumentImages(&c.plan);
  v1::DocSlot* slot =
      c.plan.mutable_ranks(1)->mutable_micro_batches(0)->mutable_sequences(0)->mutable_docs(0);
  for (auto& si : *c.plan.mutable_samples()) {
    if (si.sample_id() == slot->sample_id()) *si.add_images() = si.images(0);
  }
  c.n = slot->encoder_tokens();
  const int32_t pad = static_cast<int32_t>(c.job.config().vision().image_pad_id());
  const std::string ids =
      absl::StrCat("[100, 101, ", pad, ", 102, 103, 104, 105, ", pad, ", 106, 107]");
  auto parsed = ParseTextMember(
      absl::StrCat(R"({"schema": 2, "input_ids": )", ids, R"(, "trained": [[3, 9]]})"),
      c.job.config());
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  c.json = *parsed;
  return c;
}

// The first document's input_ids, loss_mask and doc_image_starts entries.
void ServeFirst(const Conversation& c, std::vector<int32_t>* ids, std::vector<uint8_t>* loss,
                std::vector<int32_t>* starts) {
  const PatchifyParams p = PatchifyParams::FromConfig(c.job.config().vision());
  auto layout = BatchLayout::Build(c.plan, c.plan.ranks(1), c.job.config(), p);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<char> seg(layout->total_bytes());
  layout->WriteFixed(seg.data());
  layout->WriteDocument(seg.data(), 0, c.json);
  std::map<std::string, v1::ArrayDesc> by;
  for (auto& d : layout->Finalize(seg.data(), {false, false, false}, {false, false, false}, {})) {
    by[d.name()] = d;
  }
  const auto& doc = layout->docs()[0];
  const auto* in = reinterpret_cast<const int32_t*>(seg.data() + by["input_ids"].offset());
  const auto* lm = reinterpret_cast<const uint8_t*>(seg.data() + by["loss_mask"].offset());
  const auto* st = reinterpret_cast<const int32_t*>(seg.data() + by["doc_image_starts"].offset());
  ids->assign(in + doc.token_offset, in + doc.token_offset + doc.length);
  loss->assign(lm + doc.token_offset, lm + doc.token_offset + doc.length);
  starts->assign(st + doc.image_begin, st + doc.image_begin + doc.image_count);
}

// The expected stretch: text ids, and -1 for an image's run.
void ExpectServed(const Conversation& c, const std::vector<int32_t>& want,
                  const std::vector<uint8_t>& want_loss, const std::vector<int32_t>& ids,
                  const std::vector<uint8_t>& loss, const std::vector<int32_t>& starts) {
  const auto& v = c.job.config().vision();
  std::vector<int32_t> full, full_starts;
  std::vector<uint8_t> full_loss;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] >= 0) {
      full.push_back(want[i]);
      full_loss.push_back(want_loss[i]);
      continue;
    }
    full.push_back(static_cast<int32_t>(v.vision_start_id()));
    full_starts.push_back(static_cast<int32_t>(full.size()));
    full.insert(full.end(), c.n, static_cast<int32_t>(v.image_pad_id()));
    full.push_back(static_cast<int32_t>(v.vision_end_id()));
    full_loss.insert(full_loss.end(), c.n + 2, 0);
  }
  EXPECT_EQ(ids, full);
  EXPECT_EQ(loss, full_loss);
  EXPECT_EQ(starts, full_starts);
}

// A conversation truncated before its second image: the text before the
// first, its run, the text up to the second; the second image is not
// served (nor planned), and what is served is in the true order.
TEST(BatchLayoutTest, ATruncatedConversationIsItsPrefixInOrder) {
  Conversation c = MakeConversation(::testing::TempDir() + "/layout_truncated");
  v1::DocSlot* slot =
      c.plan.mutable_ranks(1)->mutable_micro_batches(0)->mutable_sequences(0)->mutable_docs(0);
  ASSERT_EQ(slot->images_size(), 1);  // image 0 only
  slot->set_truncated(true);
  slot->set_length(c.n + 2 + 6);
  std::vector<int32_t> ids, starts;
  std::vector<uint8_t> loss;
  ServeFirst(c, &ids, &loss, &starts);
  ExpectServed(c, {100, 101, -1, 102, 103, 104, 105}, {0, 0, 0, 1, 1, 1, 1}, ids, loss, starts);
}

// The second piece of the conversation split inside the text before its
// second image: the rest of that text, the image's run, the text after.
TEST(BatchLayoutTest, APieceOfASplitConversationIsItsStretchInOrder) {
  Conversation c = MakeConversation(::testing::TempDir() + "/layout_split");
  v1::DocSlot* slot =
      c.plan.mutable_ranks(1)->mutable_micro_batches(0)->mutable_sequences(0)->mutable_docs(0);
  slot->mutable_images(0)->set_image_index(1);
  slot->set_piece(1);
  slot->set_pieces(2);
  slot->set_text_begin(4);
  slot->set_length(c.n + 2 + 4);
  std::vector<int32_t> ids, starts;
  std::vector<uint8_t> loss;
  ServeFirst(c, &ids, &loss, &starts);
  ExpectServed(c, {104, 105, -1, 106, 107}, {1, 1, 0, 1, 0}, ids, loss, starts);
  // The first piece: the text before the first image, its run, and the
  // text up to the cut.
  slot->mutable_images(0)->set_image_index(0);
  slot->set_piece(0);
  slot->set_text_begin(0);
  slot->set_length(c.n + 2 + 4);
  ServeFirst(c, &ids, &loss, &starts);
  ExpectServed(c, {100, 101, -1, 102, 103}, {0, 0, 0, 1, 1}, ids, loss, starts);
}

}  // namespace
}  // namespace tutti::stager
