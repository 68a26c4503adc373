// The simulator: the time model and the data path against steps computed by
// hand, item seconds from a model's FLOPs, the work of planned and naive
// steps, the ladder and the online fit's experiment on small worlds, and
// every bad input refused naming the field.
#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/packer/bench/bench_workload.h"
#include "services/packer/core/planner.h"
#include "services/packer/testing/jobs.h"
#include "tools/sim/calibration.h"
#include "tools/sim/fit_experiment.h"
#include "tools/sim/report.h"
#include "tools/sim/step_work.h"

namespace tutti::sim {
namespace {

Segment Seg(PhaseKind kind, std::vector<double> s) { return Segment{kind, std::move(s)}; }

TEST(TimeModelTest, StepsAsComputedByHand) {
  StepWork w;
  w.world_size = 2;
  w.segments = {Seg(kVit, {1, 3}), Seg(kLlm, {2, 1}), Seg(kLlm, {2, 2})};
  // allreduce: ranks meet at the end: max(1+2+2, 3+1+2) = 6.
  StepTime t = EvaluateStep(w, SyncModel::kAllReduce);
  EXPECT_DOUBLE_EQ(t.compute, 6);
  EXPECT_DOUBLE_EQ(t.ideal, 5.5);      // mean of 5 and 6
  EXPECT_DOUBLE_EQ(t.text_only, 3.5);  // mean LLM time: 4 and 3
  EXPECT_DOUBLE_EQ(t.max[kVit], 3);
  EXPECT_DOUBLE_EQ(t.mean[kVit], 2);
  // fsdp: every segment waits for its slowest rank: 3 + 2 + 2.
  EXPECT_DOUBLE_EQ(EvaluateStep(w, SyncModel::kFsdp).compute, 7);
  // An exchange is a meeting under allreduce too: max(1, 3) + 0.5 + max(4, 3).
  w.segments.insert(w.segments.begin() + 1, Seg(kExchange, {0.5, 0.25}));
  t = EvaluateStep(w, SyncModel::kAllReduce);
  EXPECT_DOUBLE_EQ(t.compute, 7.5);
  EXPECT_DOUBLE_EQ(t.exchange, 0.5);
  EXPECT_DOUBLE_EQ(t.ideal, 5.5);  // no exchange in the ideal step
  EXPECT_DOUBLE_EQ(EvaluateStep(w, SyncModel::kFsdp).compute, 7.5);
  // The bound: no image costs more than the mean rank, so it is the ideal.
  w.largest_vit_seconds = 1.5;
  EXPECT_DOUBLE_EQ(EvaluateStep(w, SyncModel::kAllReduce).bound, 5.5);
  EXPECT_DOUBLE_EQ(EvaluateStep(w, SyncModel::kFsdp).bound, 5.5);  // 2 + 3.5
  // An image of 2.5 s: allreduce's step is at least max(5.5, 2.5); fsdp's
  // encoder pass at least 2.5, then the mean LLM time 3.5.
  w.largest_vit_seconds = 2.5;
  EXPECT_DOUBLE_EQ(EvaluateStep(w, SyncModel::kAllReduce).bound, 5.5);
  EXPECT_DOUBLE_EQ(EvaluateStep(w, SyncModel::kFsdp).bound, 6);
  w.largest_vit_seconds = 7;
  EXPECT_DOUBLE_EQ(EvaluateStep(w, SyncModel::kAllReduce).bound, 7);
  EXPECT_DOUBLE_EQ(EvaluateStep(w, SyncModel::kFsdp).bound, 10.5);
}

DataPathOptions HandPath(uint32_t window) {
  DataPathOptions o;
  o.decode_threads = 2;
  o.prefetch_window = window;
  o.deadline_seconds = 0;
  o.nvme_latency_seconds = 0;
  o.nvme_bandwidth = 1e30;
  o.decode_seconds_per_image = 0;
  o.decode_seconds_per_megapixel = 1;  // an item's seconds are its megapixels
  return o;
}

TEST(DataPathTest, StallsAsComputedByHand) {
  // Items of 3, 1, 1, 1 s on 2 threads: 3 s per step on the one node.
  const std::vector<std::vector<DataItem>> items = {{{0, 3, 1}, {0, 1, 2}, {0, 1, 3}, {0, 1, 4}}};
  // No window: each step's batch is prepared after the previous step ends.
  DataPipeline none(HandPath(0), 1, 7);
  EXPECT_DOUBLE_EQ(none.Step(0, items, 1), 3);
  EXPECT_DOUBLE_EQ(none.Step(1, items, 1), 3);
  // A window of 1: step 1 is prepared from step 0's start (3) to 6, while
  // step 0 computes until 4.
  DataPipeline one(HandPath(1), 1, 7);
  EXPECT_DOUBLE_EQ(one.Step(0, items, 1), 3);
  EXPECT_DOUBLE_EQ(one.Step(1, items, 1), 2);
  EXPECT_DOUBLE_EQ(one.Step(2, items, 1), 2);
  // Compute longer than preparation hides it behind a window of 2.
  DataPipeline two(HandPath(2), 1, 7);
  EXPECT_DOUBLE_EQ(two.Step(0, items, 5), 3);
  EXPECT_DOUBLE_EQ(two.Step(1, items, 5), 0);
  EXPECT_DOUBLE_EQ(two.Step(2, items, 5), 0);
  // A deadline caps an item; an NFS read that stalls does not end without one.
  DataPathOptions o = HandPath(1);
  o.deadline_seconds = 2;
  EXPECT_DOUBLE_EQ(DataPipeline(o, 1, 7).ItemSeconds(0, {0, 100, 9}), 2);
  o.deadline_seconds = 0;
  o.staged = false;
  o.nfs_stall_probability = 1;
  o.nfs_stall_seconds = 30;
  EXPECT_GT(DataPipeline(o, 1, 7).ItemSeconds(0, {0, 1, 9}), 31);
}

TEST(ShapeTest, FlopsAndConstantsFollowTheModel) {
  auto m = ModelPreset("vit400m-moe16b-a3b");
  ASSERT_TRUE(m.ok());
  // p_ref = 6P / (12 L d) for the ViT: 400e6 / (2 x 27 x 1152).
  const CostModelOptions c = ShapeCostOptions(*m);
  EXPECT_NEAR(c.vit_linear / c.vit_quadratic, 400e6 / (2.0 * 27 * 1152), 1e-6);
  EXPECT_DOUBLE_EQ(c.llm_linear, 1);
  EXPECT_NEAR(c.llm_quadratic, 28.0 * 2048 / 3e9, 1e-15);
  EXPECT_NEAR(c.vit_linear, 400e6 / 3e9, 1e-12);
  auto h = ClusterPreset("h100");
  ASSERT_TRUE(h.ok());
  const ItemTiming t = TimingFromShape(*m, *h, Attention::kFlash);
  EXPECT_NEAR(t.vit_linear, 6 * 400e6 / (989e12 * 0.40), 1e-18);
  EXPECT_NEAR(t.vit_quadratic, 12.0 * 27 * 1152 / (989e12 * 0.35), 1e-22);
  EXPECT_NEAR(t.Llm(1000),
              1000 * 6 * 3e9 / (989e12 * 0.4) + 1e6 * 6.0 * 28 * 2048 / (989e12 * 0.35), 1e-12);
  // Eager attention pays for its score matrix crossing memory.
  EXPECT_GT(TimingFromShape(*m, *h, Attention::kEager).vit_quadratic, 1.5 * t.vit_quadratic);
  // The seed's 16B MoE with whole weights and gradients does not fit an
  // 80 GB GPU on 8 ranks; sharded it does.
  EXPECT_GT(StateBytes(*m, SyncModel::kAllReduce, 8), 80e9);
  EXPECT_LT(StateBytes(*m, SyncModel::kFsdp, 8), 80e9);
}

TEST(InputsTest, BadInputsAreRefusedNamingTheField) {
  auto m = ModelPreset("gpt-5");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("vit400m-moe16b-a3b"), std::string::npos);
  EXPECT_EQ(ClusterPreset("tpu").status().code(), absl::StatusCode::kNotFound);
  ClusterSpec c = *ClusterPreset("h200");
  c.network_bandwidth = 0;
  auto s = ValidateCluster(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("network_bandwidth is 0"), std::string::npos) << s;
  c = *ClusterPreset("h200");
  c.peak_flops = -1e15;
  EXPECT_NE(ValidateCluster(c).message().find("peak_flops"), std::string::npos);
  c = *ClusterPreset("h200");
  c.util_llm = 1.5;
  EXPECT_NE(ValidateCluster(c).message().find("util_llm"), std::string::npos);
  ModelShape shape = *ModelPreset("vit675m-dense7b");
  shape.llm.active_params = 2 * shape.llm.params;
  EXPECT_NE(ValidateModelShape(shape).message().find("active_params"), std::string::npos);
  DataPathOptions d;
  d.nvme_bandwidth = 0;
  EXPECT_NE(ValidateDataPath(d).message().find("nvme_bandwidth"), std::string::npos);
  EXPECT_EQ(ParseSyncModel("ring").status().code(), absl::StatusCode::kInvalidArgument);
  // Calibration pairs that are not numbers, or too few.
  auto p = ParseCalibration("# x\nvit sdpa 1024 nan\n", "pairs.txt");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(p.status().message().find("pairs.txt line 2"), std::string::npos);
  p = ParseCalibration("vit sdpa 1024 0.01\nllm flash 1024 0.02\n", "pairs.txt");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(FitCalibration(*p, Attention::kFlash, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CalibrationTest, PairsGiveTheConstants) {
  std::string text = "# tutti gpu_calibrate, test\n";
  for (double p = 256; p <= 65536; p *= 2) {
    absl::StrAppend(&text, "vit sdpa ", p, " ", 2e-6 * p + 3e-11 * p * p, "\n");
    absl::StrAppend(&text, "vit eager ", p, " ", 2e-6 * p + 9e-11 * p * p, "\n");
    absl::StrAppend(&text, "llm flash ", p, " ", 5e-5 * p + 1e-10 * p * p, "\n");
  }
  auto pairs = ParseCalibration(text, "t");
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  auto c = FitCalibration(*pairs, Attention::kEager, {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->timing.vit_quadratic / 9e-11, 1, 1e-3);
  EXPECT_NEAR(c->timing.llm_linear / 5e-5, 1, 1e-3);
  c = FitCalibration(*pairs, Attention::kFlash, {});
  ASSERT_TRUE(c.ok());
  EXPECT_NEAR(c->timing.vit_quadratic / 3e-11, 1, 1e-3);
}

// Pairs that fit well but give a term the time model cannot use (noisy CPU
// timings can): refused as the calibration's, naming the pairs.
TEST(CalibrationTest, AFitWithATermThatIsNotPositiveIsRefusedNamingThePairs) {
  std::string text;
  for (double p = 32; p <= 512; p *= 2) {
    absl::StrAppend(&text, "vit sdpa ", p, " ", 1e-9 * p * p, "\n");  // no linear term
    absl::StrAppend(&text, "vit eager ", p, " ", 1e-9 * p * p, "\n");
    absl::StrAppend(&text, "llm flash ", p, " ", 1e-6 * p, "\n");
  }
  auto pairs = ParseCalibration(text, "t");
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  auto c = FitCalibration(*pairs, Attention::kFlash, {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("calibration: the ViT's sdpa pairs (5)"), std::string::npos)
      << c.status();
  EXPECT_NE(c.status().message().find("must be positive"), std::string::npos) << c.status();
}

// A small seed workload on 8-GPU nodes.
SimSetup SmallSetup(const std::string& model = "vit400m-moe16b-a3b", double audio = 0) {
  SimSetup s;
  s.model = *ModelPreset(model);
  s.cluster = *ClusterPreset("b200");
  s.syncs = {SyncModel::kAllReduce, SyncModel::kFsdp};
  s.timing = TimingFromShape(s.model, s.cluster, s.attention);
  s.workload.audio_fraction = audio;
  s.workload.patch_size = s.model.vision.patch_size;
  s.workload.merge_size = s.model.vision.merge_size;
  auto index = packer::MakeSeedIndex(s.workload, 20000);
  EXPECT_TRUE(index.ok()) << index.status();
  s.index = *index;
  s.steps = 3;
  return s;
}

TEST(StepWorkTest, PlannedAndNaiveStepsCarryTheirWork) {
  SimSetup s = SmallSetup();
  auto shape = LadderShape(s, 16);
  ASSERT_TRUE(shape.ok()) << shape.status();
  for (const bool post : {false, true}) {
    Rung rung;
    rung.strategy = "tutti";
    rung.post_balancing = post;
    auto job = packer::Job::Create(RungConfig(s, *shape, 16, rung, 16777216), s.index);
    ASSERT_TRUE(job.ok()) << job.status();
    packer::Planner planner(*job);
    packer::StepPlanData d;
    ASSERT_TRUE(planner.Plan(2, &d).ok());
    WorkOptions o{&s.model, &s.cluster, s.timing, Attention::kFlash};
    const StepWork w = PlannedWork(**job, d, o);
    double vit = 0, want_vit = 0, tokens = 0;
    int exchanges = 0;
    for (const Segment& seg : w.segments) {
      for (double x : seg.seconds) vit += seg.kind == kVit ? x : 0;
      exchanges += seg.kind == kExchange;
    }
    for (const auto& im : d.images) want_vit += s.timing.Vit(im.patches);
    for (const auto& ps : d.samples) tokens += ps.cost.llm_tokens;
    EXPECT_NEAR(vit, want_vit, 1e-9 * want_vit);
    double largest = 0;
    for (const auto& im : d.images) largest = std::max(largest, s.timing.Vit(im.patches));
    EXPECT_DOUBLE_EQ(w.largest_vit_seconds, largest);
    EXPECT_EQ(w.llm_tokens, tokens);
    EXPECT_EQ(exchanges, post ? 2 : 0) << "an exchange forward and back with post-balancing";
    EXPECT_EQ(w.inter_node_bytes + w.intra_node_bytes > 0, post);
    size_t items = 0;
    for (const auto& n : w.node_items) items += n.size();
    EXPECT_EQ(items, d.images.size());
    // The naive placement of the same draw: the same tokens and encoder work.
    ASSERT_TRUE(planner.Draw(2, &d).ok());
    const StepWork naive = NaiveWork(**job, d, o);
    EXPECT_EQ(naive.llm_tokens, tokens);
    double nvit = 0;
    for (const Segment& seg : naive.segments) {
      for (double x : seg.seconds) nvit += seg.kind == kVit ? x : 0;
    }
    EXPECT_NEAR(nvit, want_vit, 1e-9 * want_vit);
  }
}

TEST(LadderTest, EveryRungRunsAndTuttiBeatsNaive) {
  SimSetup s = SmallSetup();
  auto runs = RunLadder(s, 16, 16777216);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), LadderRungs().size() * 2);
  const RungResult *naive = nullptr, *tutti = nullptr;
  for (const RungResult& r : *runs) {
    EXPECT_EQ(r.steps, 3u);
    EXPECT_GT(r.step_seconds, 0) << r.rung;
    EXPECT_GT(r.efficiency_ideal, 0) << r.rung;
    EXPECT_LE(r.efficiency_ideal, 1 + 1e-9) << r.rung;
    EXPECT_LE(r.efficiency_text_only, r.efficiency_ideal + 1e-9) << r.rung;
    // No placement beats the bound; it is at most the ideal.
    EXPECT_LE(r.efficiency_ideal, r.efficiency_bound + 1e-9) << r.rung;
    EXPECT_LE(r.efficiency_bound, 1 + 1e-9) << r.rung;
    if (r.sync != SyncModel::kAllReduce) continue;
    if (r.rung == "naive") naive = &r;
    if (r.rung == "tutti") tutti = &r;
  }
  ASSERT_TRUE(naive && tutti);
  EXPECT_GT(tutti->tokens_per_second, naive->tokens_per_second);
  EXPECT_GT(tutti->efficiency_ideal, naive->efficiency_ideal);
  const std::string json = LadderJson(s, {{16, 16777216, *runs}});
  for (const char* key : {"\"efficiency_ideal\"", "\"idle_share\"", "\"spread\"",
                          "\"peak_activation_bytes\"", "\"rung\": \"+ post-balancing\""}) {
    EXPECT_NE(json.find(key), std::string::npos) << key;
  }
  EXPECT_NE(LadderTable(s, {{16, 16777216, *runs}}).find("+ modality segregation"),
            std::string::npos);
}

TEST(LadderTest, AWorkloadWithoutAModalityTheLadderNeedsIsRefused) {
  SimSetup s = SmallSetup();
  packer::SyntheticOptions o = packer::testing::SmallDataset(3000);
  o.vl_fraction = 0;
  s.index = packer::testing::SyntheticIndex(o);
  auto r = RunLadder(s, 8, 1003520);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("no samples with images"), std::string::npos) << r.status();
  // A three-modality model on a workload without audio.
  s = SmallSetup("vit675m-whisper-dense7b");
  r = RunLadder(s, 8, 1003520);
  EXPECT_NE(r.status().message().find("no audio clips"), std::string::npos) << r.status();
  // A model that does not fit: the seed's MoE with whole states on H100s.
  s = SmallSetup();
  s.cluster = *ClusterPreset("h100");
  s.syncs = {SyncModel::kAllReduce};
  r = RunLadder(s, 8, 1003520);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("does not fit the cluster's memory"), std::string::npos);
  EXPECT_EQ(RunLadder(SmallSetup(), 12, 1003520).status().code(),
            absl::StatusCode::kInvalidArgument);  // not whole nodes
  EXPECT_NE(RunLadder(SmallSetup(), 8, 1003520, {"bogus"}).status().message().find("bogus"),
            std::string::npos);
}

TEST(FitExperimentTest, TheFitBringsTheSlowestRankBackToTheMean) {
  SimSetup s = SmallSetup();
  FitExperimentOptions o;
  o.world_size = 16;
  o.steps = 60;
  o.interval_steps = 10;
  o.window = 10;
  auto r = RunFitExperiment(s, o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->fits.empty());
  // The configured constants (quadratic terms 4x too heavy) balance the
  // wrong quantity; the fitted ones as well as the true ones.
  EXPECT_GT(r->configured_after.vit, r->truth_after.vit);
  EXPECT_LT(r->after.vit, r->configured_after.vit);
  EXPECT_NEAR(r->after.vit, r->truth_after.vit, 0.01);
  EXPECT_NE(FitExperimentText(o, *r).find("with the online fit"), std::string::npos);
}

}  // namespace
}  // namespace tutti::sim
