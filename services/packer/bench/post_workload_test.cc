#include "services/packer/bench/post_workload.h"

#include <gtest/gtest.h>

namespace tutti::dispatch {
namespace {

TEST(WorkloadTest, SeedShapeAndDeterminism) {
  WorkloadOptions o;
  o.world_size = 16;
  auto a = GenerateWorkload(o);
  auto b = GenerateWorkload(o);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->input.samples.size(), b->input.samples.size());
  uint64_t text = 0, vl = 0;
  for (size_t s = 0; s < a->input.samples.size(); ++s) {
    const Sample& x = a->input.samples[s];
    EXPECT_EQ(x.llm_tokens, b->input.samples[s].llm_tokens);
    EXPECT_EQ(x.sample_id, s);
    EXPECT_EQ(x.drawn_rank, s % 16);
    EXPECT_LE(x.llm_tokens, o.seq_len);
    (x.vl ? vl : text) += x.llm_tokens;
    for (const EncoderItem& it : x.items[int(EncoderKind::kVision)]) {
      EXPECT_LE(uint64_t{it.height} * it.width, o.geometry.max_pixels);
      EXPECT_EQ(it.height % 28, 0u);
      EXPECT_EQ(it.units, it.grid_h * it.grid_w);
      EXPECT_EQ(it.output_tokens * 4, it.units);
    }
  }
  // Fill ~85% of 3 text and 1 VL sequences of 32768 per rank.
  EXPECT_NEAR(double(text) / (16.0 * 3 * 32768), 0.85, 0.02);
  EXPECT_NEAR(double(vl) / (16.0 * 32768), 0.85, 0.05);
  const double vl_share = double(a->vl_samples) / a->input.samples.size();
  EXPECT_GT(vl_share, 0.1);
  EXPECT_LT(vl_share, 0.3);
  EXPECT_EQ(a->options.cluster.world_size, 16u);
  EXPECT_EQ(a->options.slots.sequences(), 4u);
}

TEST(WorkloadTest, AudioShareAndBadOptions) {
  WorkloadOptions o;
  o.world_size = 8;
  o.audio_share = 0.5;
  auto w = GenerateWorkload(o);
  ASSERT_TRUE(w.ok());
  EXPECT_GT(w->audio_clips, 0u);
  o.shard_nodes = 1;
  o.ranks_per_node = 2;  // 4 nodes
  auto r = GenerateWorkload(o);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->input.availability.all());
  EXPECT_TRUE(r->input.availability.Has(5, 1));
  EXPECT_FALSE(r->input.availability.Has(5, 2));
  o.ranks_per_node = 8;
  o.world_size = 12;
  EXPECT_FALSE(GenerateWorkload(o).ok());
  o.world_size = 8;
  o.fill = 0;
  EXPECT_FALSE(GenerateWorkload(o).ok());
}

}  // namespace
}  // namespace tutti::dispatch
