#include "common/job_config.h"

#include "gtest/gtest.h"

namespace tutti {
namespace {

v1::JobConfig Parse(const std::string& text) {
  auto c = ParseJobConfig(text, "test");
  EXPECT_TRUE(c.ok()) << c.status();
  v1::JobConfig config = *c;
  ApplyJobDefaults(&config);
  return config;
}

TEST(JobConfigTest, DefaultsAndStages) {
  auto c = Parse(R"pb(
    seed: 7 world_size: 16 ranks_per_node: 8
    batch { text_samples_per_step: 64 vl_samples_per_step: 16 }
    curriculum { start_step: 0 max_pixels: 1000000 seq_len: 4096 }
    curriculum { start_step: 100 max_pixels: 16000000 seq_len: 32768 }
  )pb");
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  EXPECT_EQ(c.vision().patch_size(), 14u);
  EXPECT_EQ(c.packing().strategy(), "tutti");
  EXPECT_EQ(StageAt(c, 0).seq_len(), 4096u);
  EXPECT_EQ(StageAt(c, 99).seq_len(), 4096u);
  EXPECT_EQ(StageAt(c, 100).max_pixels(), 16000000u);
  EXPECT_EQ(JobFingerprint(c), JobFingerprint(c));
  auto d = c;
  d.set_seed(8);
  EXPECT_NE(JobFingerprint(c), JobFingerprint(d));
}

TEST(JobConfigTest, ParseErrorNamesLine) {
  auto c = ParseJobConfig("seed: 1\nbogus_field: 3\n", "job.textproto");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("job.textproto"), std::string::npos);
  EXPECT_NE(c.status().message().find("line 2"), std::string::npos);
}

TEST(JobConfigTest, ZeroWorldSizeIsReportedAsItself) {
  auto c = Parse(R"pb(world_size: 0 ranks_per_node: 2
                      batch { text_samples_per_step: 4 })pb");
  const absl::Status s = ValidateJobConfig(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("world_size is 0"), std::string::npos) << s;
  auto r = Parse(R"pb(world_size: 4 ranks_per_node: 0
                      batch { text_samples_per_step: 4 })pb");
  EXPECT_NE(ValidateJobConfig(r).message().find("ranks_per_node is 0"), std::string::npos);
  // Not given at all: the defaults (1 rank on 1 node).
  auto d = Parse("batch { text_samples_per_step: 4 }");
  EXPECT_EQ(d.world_size(), 1u);
  EXPECT_EQ(d.ranks_per_node(), 1u);
  EXPECT_TRUE(ValidateJobConfig(d).ok()) << ValidateJobConfig(d);
}

TEST(JobConfigTest, NegativeNumberIsNamedNotAParserToken) {
  auto c = ParseJobConfig("seed: 1\nbatch {\n  vl_samples_per_step: -4\n}\n", "job.textproto");
  ASSERT_FALSE(c.ok());
  const std::string m(c.status().message());
  EXPECT_NE(m.find("line 3"), std::string::npos) << m;
  EXPECT_NE(m.find("negative number for 'vl_samples_per_step'"), std::string::npos) << m;
  EXPECT_EQ(m.find("Expected integer"), std::string::npos) << m;
}

TEST(JobConfigTest, SeedRatioExample) {
  v1::BatchConfig b;
  b.set_grad_accum(2);
  b.set_text_micro_batch(4);
  b.set_vl_micro_batch(1);
  b.set_text_vl_ratio("4:1");
  b.set_text_samples_per_step(8);
  b.set_vl_samples_per_step(2);
  auto s = SplitMicroBatches(b);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->text_micro_batches, 1u);
  EXPECT_EQ(s->vl_micro_batches, 1u);
}

TEST(JobConfigTest, RatioThatCannotBeMetIsRefused) {
  v1::BatchConfig b;
  b.set_grad_accum(2);
  b.set_text_micro_batch(3);
  b.set_vl_micro_batch(1);
  b.set_text_vl_ratio("4:1");
  auto s = SplitMicroBatches(b);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("4:1"), std::string::npos);
  EXPECT_NE(s.status().message().find("grad_accum 2"), std::string::npos);
  b.set_text_vl_ratio("four to one");
  EXPECT_FALSE(SplitMicroBatches(b).ok());
}

TEST(JobConfigTest, UnknownStrategyIsRefused) {
  auto c = Parse(R"pb(batch { text_samples_per_step: 4 } packing { strategy: "magic" })pb");
  auto s = ValidateJobConfig(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("magic"), std::string::npos);
  EXPECT_NE(s.message().find("seed-v2"), std::string::npos);
}

TEST(JobConfigTest, WorldMustBeWholeNodes) {
  auto c = Parse(R"pb(world_size: 12 ranks_per_node: 8 batch { text_samples_per_step: 4 })pb");
  EXPECT_FALSE(ValidateJobConfig(c).ok());
}

}  // namespace
}  // namespace tutti
