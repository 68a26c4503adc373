#include "services/stager/batch_layout.h"

#include <vector>

#include "common/job_config.h"
#include "gtest/gtest.h"
#include "services/stager/test_dataset.h"

namespace tutti::stager {
namespace {

TEST(BatchLayoutTest, ArraysFollowThePlan) {
  auto data = testing::WriteDataset(::testing::TempDir() + "/layout_ds", {.shards = 1, .samples_per_shard = 3});
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
  EXPECT_EQ(ids[0], 151652);  // vision_start
  EXPECT_EQ(ids[1], 151655);  // image_pad
  EXPECT_EQ(ids[doc.text_offset - 1], 151653);  // vision_end
  EXPECT_EQ(ids[doc.text_offset], 7);
  EXPECT_EQ(ids[doc.text_offset + 3], 7);  // fitted by repeating
  const int32_t* cu = reinterpret_cast<const int32_t*>(seg.data() + by["cu_seqlens"].offset());
  EXPECT_EQ(cu[1], static_cast<int32_t>(layout->docs()[0].length));
  EXPECT_EQ(cu[2], static_cast<int32_t>(layout->docs()[0].length + layout->docs()[1].length));
  EXPECT_EQ(by["input_ids"].shape(0), static_cast<uint64_t>(cu[2]));
}

TEST(BatchLayoutTest, InconsistentPlanIsRefused) {
  auto data = testing::WriteDataset(::testing::TempDir() + "/layout_ds2", {.shards = 1, .samples_per_shard = 2});
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
  auto ids = ParseInputIds(R"({"text": "x", "input_ids": [1, 22 ,-3]})");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 22, -3}));
  EXPECT_EQ(ParseInputIds(R"({"tokens": 5})").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ParseInputIds(R"({"input_ids": [1, 2)").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseInputIds(R"({"input_ids": [1, "a"]})").status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace tutti::stager
