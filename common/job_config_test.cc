#include "common/job_config.h"

#include "absl/strings/str_cat.h"
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
  EXPECT_EQ(JobFingerprint(c, "i"), JobFingerprint(c, "i"));
  auto d = c;
  d.set_seed(8);
  EXPECT_NE(JobFingerprint(c, "i"), JobFingerprint(d, "i"));
}

// The fingerprint covers what determines the plans: the index's content
// identity, not how its path is spelled.
TEST(JobConfigTest, FingerprintCoversTheIndexContentNotItsPath) {
  auto c = Parse("batch { text_samples_per_step: 4 }");
  auto relative = c, absolute = c;
  relative.set_index_path("data/index.tutti");
  absolute.set_index_path("/work/data/index.tutti");
  EXPECT_EQ(JobFingerprint(relative, "0123456789abcdef"),
            JobFingerprint(absolute, "0123456789abcdef"));
  EXPECT_EQ(JobFingerprint(c, "0123456789abcdef"), JobFingerprint(absolute, "0123456789abcdef"));
  EXPECT_NE(JobFingerprint(relative, "0123456789abcdef"),
            JobFingerprint(relative, "fedcba9876543210"));
}

// So does a mixture's: which file each source draws from counts, not the
// spelling of its path.
TEST(JobConfigTest, FingerprintCoversWhichFileAMixtureSourceDrawsFrom) {
  auto with = [](const char* job, const char* a, const char* b) {
    auto c =
        Parse(absl::StrCat("index_path: '", job, "' batch { text_samples_per_step: 4 } mixture { ",
                           "sources { name: 'a' index_path: '", a, "' weight: 1 } ",
                           "sources { name: 'b' index_path: '", b, "' weight: 1 } }"));
    return JobFingerprint(c, "0123456789abcdef");
  };
  EXPECT_EQ(with("x.idx", "a.idx", "b.idx"), with("/w/x.idx", "/w/a.idx", "/w/b.idx"));
  EXPECT_EQ(with("x.idx", "x.idx", "b.idx"), with("/w/x.idx", "", "/w/b.idx"));
  EXPECT_EQ(with("x.idx", "a.idx", "a.idx"), with("/w/x.idx", "/w/a.idx", "/w/a.idx"));
  EXPECT_NE(with("x.idx", "a.idx", "a.idx"), with("x.idx", "a.idx", "b.idx"));
  EXPECT_NE(with("x.idx", "", "b.idx"), with("x.idx", "b.idx", ""));
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

TEST(JobConfigTest, LocalityBoundsAreChecked) {
  auto c = Parse(R"pb(batch { text_samples_per_step: 4 })pb");
  const std::string off = JobFingerprint(c, "i");
  EXPECT_FALSE(c.has_locality());
  c.mutable_locality()->set_home_replication(2);
  c.mutable_locality()->set_node_cache_bytes(uint64_t{1} << 40);
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  EXPECT_NE(JobFingerprint(c, "i"), off);
  c.mutable_locality()->set_home_replication(kMaxHomeReplication + 1);
  auto s = ValidateJobConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("locality.home_replication 17"), std::string::npos) << s;
  c.mutable_locality()->set_home_replication(0);
  s = ValidateJobConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("node_cache_bytes is set"), std::string::npos) << s;
}

// Every numeric field has a range, refused at load naming the field, its
// value and the range; so do the products the plans are sized by.
TEST(JobConfigTest, EveryNumericFieldIsBoundedNamingItsRange) {
  struct Case {
    const char* config;
    const char* message;
  };
  const Case cases[] = {
      {"batch { vl_samples_per_step: 4 vl_micro_batch: 2147483647 }",
       "batch.vl_micro_batch 2147483647 is outside its range 1..1024"},
      {"batch { text_samples_per_step: 4 text_micro_batch: 4294967295 }",
       "batch.text_micro_batch 4294967295 is outside its range 1..1024"},
      {"batch { vl_samples_per_step: 4 grad_accum: 4294967295 }",
       "batch.grad_accum 4294967295 is outside its range 1..1024"},
      {"batch { vl_samples_per_step: 4294967295 }",
       "batch.vl_samples_per_step 4294967295 is outside its range 0..1048576"},
      {"world_size: 2147483648 ranks_per_node: 1 batch { vl_samples_per_step: 4 }",
       "world_size 2147483648 is outside its range 1..65536"},
      {"world_size: 4096 ranks_per_node: 4096 batch { vl_samples_per_step: 4 }",
       "ranks_per_node 4096 is outside its range 1..1024"},
      {"plan_window: 100000 batch { vl_samples_per_step: 4 }",
       "plan_window 100000 is outside its range 1..256"},
      {"sample_deadline_ms: 4000000000 batch { vl_samples_per_step: 4 }",
       "sample_deadline_ms 4000000000 is outside its range 1..600000"},
      {"epochs: 4000000000 batch { vl_samples_per_step: 4 }",
       "epochs 4000000000 is outside its range 0..1000000"},
      {"curriculum { seq_len: 4000000000 } batch { vl_samples_per_step: 4 }",
       "curriculum[0].seq_len 4000000000 is outside its range 16..1048576"},
      {"curriculum { max_pixels: 1000000000000 } batch { vl_samples_per_step: 4 }",
       "curriculum[0].max_pixels 1000000000000 is outside its range 1..67108864"},
      {"vision { patch_size: 100000 } batch { vl_samples_per_step: 4 }",
       "vision.patch_size 100000 is outside its range 1..128"},
      {"vision { max_source_side: 100000 } batch { vl_samples_per_step: 4 }",
       "vision.max_source_side 100000 is outside its range 1..65535"},
      {"vision { image_pad_id: 3000000000 } batch { vl_samples_per_step: 4 }",
       "vision.image_pad_id 3000000000 is outside its range 0..2147483647"},
      {"vision { max_aspect_ratio: inf } batch { vl_samples_per_step: 4 }",
       "vision.max_aspect_ratio inf is outside its range 1..1000"},
      {"cost { llm_quadratic: nan } batch { vl_samples_per_step: 4 }",
       "cost.llm_quadratic nan is outside its range 0..1e+09"},
      {"cost { vit_linear: -1 } batch { vl_samples_per_step: 4 }",
       "cost.vit_linear -1 is outside its range 0..1e+09"},
      {"audio { max_seconds: 4000000000 } batch { vl_samples_per_step: 4 }",
       "audio.max_seconds 4000000000 is outside its range 1..3600"},
      {"packing { improvement_rounds: 4000000000 } batch { vl_samples_per_step: 4 }",
       "packing.improvement_rounds 4000000000 is outside its range 1..4096"},
      {"packing { open_bins: 4000000000 } batch { vl_samples_per_step: 4 }",
       "packing.open_bins 4000000000 is outside its range 1..1024"},
      {"post_balancing { hidden_size: 4000000000 } batch { vl_samples_per_step: 4 }",
       "post_balancing.hidden_size 4000000000 is outside its range 1..65536"},
      {"overflow { max_deferred_samples: 4000000000 } batch { vl_samples_per_step: 4 }",
       "overflow.max_deferred_samples 4000000000 is outside its range 0..4194304"},
      {"batch { vl_samples_per_step: 4 text_vl_ratio: '0:4000000000' }",
       "batch.text_vl_ratio's VL term 4000000000 is outside its range 0..65536"},
      // Products of fields each in range.
      {"world_size: 65536 ranks_per_node: 8 batch { vl_samples_per_step: 4 vl_micro_batch: 128 }",
       "a step's sequences would be 16777216 (world_size 65536 x 256 sequences a rank), above "
       "the limit 2097152"},
      {"batch { vl_samples_per_step: 4 grad_accum: 1024 vl_micro_batch: 1024 }",
       "a rank's sequences a step would be 1048576"},
      {"batch { vl_samples_per_step: 4 grad_accum: 64 vl_micro_batch: 64 }"
       " curriculum { seq_len: 32768 }",
       "a rank's tokens a step would be 134217728 (4096 sequences a rank x the longest seq_len "
       "32768), above the limit 67108864"},
      {"plan_window: 256 batch { vl_samples_per_step: 1048576 }",
       "the samples held in the plan window would be 268435456"},
      {"vision { temporal_patch: 16 } curriculum { max_pixels: 67108864 }"
       " batch { vl_samples_per_step: 4 }",
       "one image's pixel_values would be 12884901888"},
      {"audio { sample_rate: 384000 max_seconds: 3600 } batch { vl_samples_per_step: 4 }",
       "an audio clip would be 1382400000"},
  };
  for (const Case& c : cases) {
    const absl::Status s = ValidateJobConfig(Parse(c.config));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.config;
    EXPECT_NE(s.message().find(c.message), std::string::npos) << c.config << "\n" << s;
  }
  // Each field at the edge of its range is accepted.
  const absl::Status edge = ValidateJobConfig(Parse(R"pb(
    world_size: 65536
    ranks_per_node: 1024
    plan_window: 4
    epochs: 1000000
    sample_deadline_ms: 600000
    batch {
      text_samples_per_step: 1048576
      vl_samples_per_step: 1048576
      grad_accum: 32
      text_micro_batch: 1
      vl_micro_batch: 1
      max_patches_per_chunk: 16777216
    }
    curriculum { max_pixels: 67108864 seq_len: 1048576 }
    vision { patch_size: 128 merge_size: 8 max_source_side: 65535 max_aspect_ratio: 1000 }
    packing { improvement_rounds: 4096 open_bins: 1024 }
    post_balancing { hidden_size: 65536 }
  )pb"));
  EXPECT_TRUE(edge.ok()) << edge;
}

TEST(JobConfigTest, WorldMustBeWholeNodes) {
  auto c = Parse(R"pb(world_size: 12 ranks_per_node: 8 batch { text_samples_per_step: 4 })pb");
  EXPECT_FALSE(ValidateJobConfig(c).ok());
}

}  // namespace
}  // namespace tutti
