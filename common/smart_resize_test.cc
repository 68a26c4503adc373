#include "common/smart_resize.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace tutti {
namespace {

TEST(SmartResizeTest, MatchesQwen2VlReference) {
  VisionGeometryOptions o;  // transformers defaults: min 3136, max 1003520
  // Values computed with the reference Python implementation.
  auto g = SmartResize(1080, 1920, o);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->height, 728u);
  EXPECT_EQ(g->width, 1316u);
  EXPECT_EQ(g->grid_h, 52u);
  EXPECT_EQ(g->grid_w, 94u);
  EXPECT_EQ(g->patches, 52u * 94u);
  EXPECT_EQ(g->llm_tokens, 52u * 94u / 4);
  auto small = SmartResize(10, 10, o);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->height, 56u);
  EXPECT_EQ(small->width, 56u);
  auto exact = SmartResize(224, 224, o);
  EXPECT_EQ(exact->height, 224u);
  EXPECT_EQ(exact->llm_tokens, 64u);
}

TEST(SmartResizeTest, StaysWithinBoundsAndFactor) {
  VisionGeometryOptions o;
  o.max_pixels = 12845056;
  for (uint32_t h : {28u, 100u, 777u, 4096u, 8000u}) {
    for (uint32_t w : {28u, 333u, 1024u, 4096u, 9000u}) {
      if (std::max(h, w) > 200 * std::min(h, w)) continue;
      auto g = SmartResize(h, w, o);
      ASSERT_TRUE(g.ok()) << h << "x" << w;
      EXPECT_EQ(g->height % 28, 0u);
      EXPECT_EQ(g->width % 28, 0u);
      EXPECT_LE(uint64_t{g->height} * g->width, o.max_pixels);
      EXPECT_GE(uint64_t{g->height} * g->width, o.min_pixels);
    }
  }
}

TEST(SmartResizeTest, SeedExampleAtPatch16) {
  VisionGeometryOptions o;
  o.patch_size = 16;
  o.max_pixels = 4096ull * 4096ull;
  auto g = SmartResize(4096, 4096, o);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->patches, 65536u);
  EXPECT_EQ(g->llm_tokens, 16384u);
}

TEST(SmartResizeTest, RefusesBadShapes) {
  VisionGeometryOptions o;
  EXPECT_EQ(SmartResize(0, 10, o).status().code(), absl::StatusCode::kInvalidArgument);
  auto wide = SmartResize(10, 5000, o);
  EXPECT_EQ(wide.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wide.status().message().find("aspect ratio"), std::string::npos);
}

}  // namespace
}  // namespace tutti
