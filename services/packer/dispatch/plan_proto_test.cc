#include "services/packer/dispatch/plan_proto.h"

#include <gtest/gtest.h>

#include "services/packer/dispatch/dispatcher.h"
#include "services/packer/dispatch/test_util.h"

namespace tutti::dispatch {
namespace {

using testing::SmallOptions;
using testing::Text;
using testing::Vl;

TEST(PlanProtoTest, RankPlansCarryPhasesExchangeAndCosts) {
  DispatchInput in;
  in.samples.push_back(Vl(10, {400, 800, 40000}, 50, 0));
  in.samples.push_back(Vl(11, {}, 30, 1));
  testing::AddAudio(&in.samples.back(), 300);
  for (uint64_t id = 20; id < 30; ++id) in.samples.push_back(Text(id, 100 + 37 * id, id % 4));
  DispatchOptions o = SmallOptions(4, 2, 16384);
  auto plan = Dispatch(in, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  PlanProtoOptions po;
  po.max_patches_per_chunk = 1000;

  uint32_t images = 0, clips = 0, docs = 0, drawn = 0;
  uint64_t sent = 0, received = 0;
  for (uint32_t r = 0; r < 4; ++r) {
    v1::RankPlan rp;
    ASSERT_TRUE(FillRankPlan(in, o, *plan, r, po, &rp).ok());
    EXPECT_EQ(rp.rank(), r);
    EXPECT_EQ(rp.node(), r / 2);
    ASSERT_EQ(rp.micro_batches_size(), 2);
    EXPECT_EQ(rp.micro_batches(0).modality(), v1::MODALITY_TEXT);
    EXPECT_EQ(rp.micro_batches(1).modality(), v1::MODALITY_VL);
    for (const auto& mb : rp.micro_batches()) {
      for (const auto& seq : mb.sequences()) {
        uint32_t offset = 0;
        for (const auto& d : seq.docs()) {
          EXPECT_EQ(d.offset(), offset);
          offset += d.length();
          ++docs;
        }
        EXPECT_EQ(seq.tokens(), offset);
        EXPECT_LE(seq.tokens(), 16384u);
      }
    }
    ASSERT_EQ(rp.encoders_size(), 2);  // vision and audio, on every rank
    EXPECT_EQ(rp.encoders(0).encoder(), v1::ENCODER_VISION);
    EXPECT_EQ(rp.encoders(1).encoder(), v1::ENCODER_AUDIO);
    for (const auto& img : rp.encoders(0).images()) {
      EXPECT_EQ(img.output_bytes(), uint64_t{img.llm_tokens()} * o.hidden_size * 2);
      EXPECT_EQ(img.llm_rank(), plan->llm_rank[img.sample_id() == 10 ? 0 : 1]);
      EXPECT_FALSE(img.remote_load());
      ++images;
    }
    // Chunks: every image once, at most 1000 patches unless alone.
    int in_chunks = 0;
    for (const auto& ch : rp.encoders(0).chunks()) {
      in_chunks += ch.items_size();
      if (ch.items_size() > 1) {
        EXPECT_LE(ch.patches(), 1000u);
      }
    }
    EXPECT_EQ(in_chunks, rp.encoders(0).images_size());
    clips += rp.encoders(1).audio_size();
    EXPECT_DOUBLE_EQ(rp.cost().vit(), rp.encoders(0).cost());
    EXPECT_DOUBLE_EQ(rp.cost().llm(), plan->llm[r].cost);
    sent += rp.exchange().send_bytes();
    received += rp.exchange().recv_bytes();
    for (const auto& t : rp.exchange().sends()) {
      uint64_t bytes = 0;
      for (const auto& it : t.items()) bytes += it.bytes();
      EXPECT_EQ(bytes, t.bytes());
    }
    EXPECT_EQ(rp.load_exchange().send_bytes(), 0u);
    drawn += rp.drawn_size();
  }
  EXPECT_EQ(images, 3u);
  EXPECT_EQ(clips, 1u);
  EXPECT_EQ(docs, in.samples.size());
  EXPECT_EQ(drawn, in.samples.size());
  EXPECT_EQ(sent, received);

  v1::PlanStats stats;
  FillPlanStats(*plan, &stats);
  ASSERT_EQ(stats.phases_size(), 3);
  EXPECT_EQ(stats.phases(0).phase(), "vit");
  EXPECT_EQ(stats.phases(1).phase(), "audio");
  EXPECT_EQ(stats.phases(2).phase(), "llm");
  EXPECT_EQ(stats.inter_node_bytes(), plan->stats.inter_node_bytes);

  v1::RankPlan rp;
  EXPECT_EQ(FillRankPlan(in, o, *plan, 4, po, &rp).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlanProtoTest, RemoteLoadsAppearInTheLoadExchange) {
  DispatchInput in;
  for (uint64_t id = 0; id < 8; ++id) in.samples.push_back(Vl(id, {1000, 1000}, 10, id % 4, 0));
  in.availability = ShardAvailability::None(1, 2);
  in.availability.Set(0, 0, true);
  const DispatchOptions o = SmallOptions(4, 2, 8192);
  auto plan = Dispatch(in, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  uint32_t remote_images = 0, text_items = 0, pixel_items = 0;
  for (uint32_t r = 0; r < 4; ++r) {
    v1::RankPlan rp;
    ASSERT_TRUE(FillRankPlan(in, o, *plan, r, PlanProtoOptions{}, &rp).ok());
    for (const auto& img : rp.encoders(0).images()) remote_images += img.remote_load();
    for (const auto& t : rp.load_exchange().recvs()) {
      for (const auto& it : t.items()) {
        if (it.encoder() == v1::ENCODER_VISION) {
          ++pixel_items;
          EXPECT_EQ(it.bytes(), PixelBytes(1000, 2, 14, 4));
        } else {
          EXPECT_EQ(it.encoder(), v1::ENCODER_UNSPECIFIED);
          EXPECT_EQ(it.bytes(), 40u);
          ++text_items;
        }
      }
    }
    for (const auto& mb : rp.micro_batches()) {
      for (const auto& seq : mb.sequences()) {
        for (const auto& d : seq.docs()) text_items -= d.remote_load();
      }
    }
  }
  EXPECT_EQ(remote_images, 8u);
  EXPECT_EQ(pixel_items, 8u);
  EXPECT_EQ(text_items, 0u);  // every remote document's token ids arrive once
}

}  // namespace
}  // namespace tutti::dispatch
