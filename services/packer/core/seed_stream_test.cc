#include "services/packer/core/seed_stream.h"

#include <vector>

#include "gtest/gtest.h"

namespace tutti::packer {
namespace {

PackItem Text(uint32_t tokens) { return PackItem{tokens, 0, 0.0, 0.0}; }
PackItem Image(uint32_t tokens, uint32_t image_tokens, double vit) {
  return PackItem{tokens, image_tokens, vit, 0.0};
}

// The seed's rule, one decision at a time: image samples to the bin with the
// fewest image tokens (v1) or least ViT cost (v2), text samples to the bin
// with the fewest tokens, the fullest bin out when nothing fits.
TEST(SeedStreamTest, PlacesAsTheSeedDescribes) {
  for (bool v2 : {false, true}) {
    SeedStreamPacker p({2, v2, 100, 0});
    std::vector<StreamPack> out;
    ASSERT_TRUE(p.Add(Image(30, 20, 5.0), &out).ok());  // bin 0 (ties: first)
    ASSERT_TRUE(p.Add(Image(10, 8, 9.0), &out).ok());   // bin 1: no image tokens yet
    // Bin 0 holds 20 image tokens / ViT 5, bin 1 8 / 9: v1 picks bin 1, v2 bin 0.
    ASSERT_TRUE(p.Add(Image(10, 4, 1.0), &out).ok());
    // Text: the bin with the fewest tokens (v1: 30 vs 20 -> bin 1; v2: 40 vs 10 -> bin 1).
    ASSERT_TRUE(p.Add(Text(50), &out).ok());
    EXPECT_TRUE(out.empty());
    // 75 tokens fit nowhere (v1: 30 / 70; v2: 40 / 60): the fullest bin is emitted.
    ASSERT_TRUE(p.Add(Text(75), &out).ok());
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].tokens, v2 ? 60u : 70u) << v2;
    EXPECT_EQ(out[0].image_tokens, v2 ? 8u : 12u) << v2;
    p.Flush(&out);
    ASSERT_EQ(out.size(), 3u);
    uint32_t items = 0, tokens = 0;
    for (const StreamPack& pk : out) items += pk.items, tokens += pk.tokens;
    EXPECT_EQ(items, 5u);
    EXPECT_EQ(tokens, 175u);
  }
}

// Bins stay open across the stream (no per-step flush), the cap holds in
// every pack, and every sample lands in exactly one pack.
TEST(SeedStreamTest, CapHoldsAndEverySampleIsPackedOnce) {
  SeedStreamPacker p({4, false, 1000, 300});
  std::vector<StreamPack> out;
  uint64_t items = 0, tokens = 0;
  for (uint32_t i = 0; i < 2000; ++i) {
    const PackItem it = i % 3 == 0 ? Image(50 + i % 170, 40 + i % 150, 1.0) : Text(20 + i % 90);
    ASSERT_TRUE(p.Add(it, &out).ok());
    ++items;
    tokens += it.tokens;
  }
  p.Flush(&out);
  uint64_t got_items = 0, got_tokens = 0;
  bool spans = false;
  for (const StreamPack& pk : out) {
    EXPECT_LE(pk.tokens, 1000u);
    EXPECT_LE(pk.image_tokens, 300u);
    got_items += pk.items;
    got_tokens += pk.tokens;
    // A pack's samples are not one contiguous run when bins interleave.
    spans |= pk.last_item - pk.first_item + 1 > pk.items;
  }
  EXPECT_EQ(got_items, items);
  EXPECT_EQ(got_tokens, tokens);
  EXPECT_TRUE(spans);
  EXPECT_FALSE(p.Add(Image(10, 301, 1.0), &out).ok());
  EXPECT_FALSE(p.Add(Text(1001), &out).ok());
}

}  // namespace
}  // namespace tutti::packer
