#include "client/examples/rank_step.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "client/test_segment.h"

namespace tutti {
namespace {

using ::testing::HasSubstr;

TEST(RankStep, SummarizesABatch) {
  testing::TestSegment seg;
  std::vector<float> px(5 * 1176);
  seg.Add("pixel_values", v1::DTYPE_FLOAT32, {5, 1176}, px)
      .Add("image_grid_thw", v1::DTYPE_INT32, {2, 3}, std::vector<int32_t>{1, 1, 1, 1, 2, 2})
      .Add("input_ids", v1::DTYPE_INT32, {6}, std::vector<int32_t>{1, 2, 3, 4, 5, 6})
      .Add("seq_offsets", v1::DTYPE_INT32, {3}, std::vector<int32_t>{0, 4, 6});
  v1::BatchDescriptor d = seg.Write(9, 1);
  d.mutable_plan()->mutable_exchange()->set_send_bytes(1000);
  d.mutable_plan()->mutable_exchange()->set_recv_bytes(2000);
  d.add_skipped()->set_reason("deadline");
  auto batch = Batch::Map(d);
  ASSERT_TRUE(batch.ok()) << batch.status();
  batch->set_wait_seconds(0.0125);
  StepRow row = SummarizeBatch(*batch);
  EXPECT_EQ(row.step, 9u);
  EXPECT_EQ(row.rank, 1u);
  EXPECT_EQ(row.images, 2u);
  EXPECT_EQ(row.patches, 5u);
  EXPECT_EQ(row.tokens, 6u);
  EXPECT_EQ(row.sequences, 2u);
  EXPECT_EQ(row.skipped, 1u);
  EXPECT_EQ(row.send_bytes, 1000u);
  EXPECT_EQ(row.recv_bytes, 2000u);
  EXPECT_DOUBLE_EQ(row.wait_ms, 12.5);
  const std::string text = FormatStepRow(row);
  EXPECT_THAT(text, HasSubstr("12.50"));
  EXPECT_THAT(StepTableHeader(), HasSubstr("wait_ms"));
  EXPECT_EQ(StepTableHeader().size(), text.size());  // columns line up
}

TEST(RankStep, StagerForRankFillsNodesInBlocks) {
  EXPECT_EQ(*StagerForRank("", 3, 4), "");
  EXPECT_EQ(*StagerForRank("a:1", 3, 4), "a:1");
  EXPECT_EQ(*StagerForRank("a:1,b:2", 1, 4), "a:1");
  EXPECT_EQ(*StagerForRank("a:1,b:2", 2, 4), "b:2");
  EXPECT_EQ(*StagerForRank("a:1, b:2", 3, 4), "b:2");
  EXPECT_THAT(std::string(StagerForRank("a:1,b:2", 0, 3).status().message()),
              HasSubstr("lists 2 stagers (one per node) but the job has 3 ranks"));
}

}  // namespace
}  // namespace tutti
