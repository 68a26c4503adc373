// The online cost fit in the packer: reports timed with constants 4x off
// the configured ones make the packer announce a fit ahead, record it and
// plan the following steps with it; a packer restarted from the record
// plans every step byte for byte as the first one served it, and its own
// fits land after every step its predecessor may have planned. Reports
// that are NaN, negative or from another job are refused naming the field.
#include <prometheus/registry.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "gtest/gtest.h"
#include "services/packer/cost_fit_record.h"
#include "services/packer/packer.h"
#include "services/packer/plan_proto.h"
#include "services/packer/testing/jobs.h"

namespace tutti::packer {
namespace {

constexpr char kConfig[] = R"pb(
  seed: 3
  world_size: 8
  ranks_per_node: 4
  plan_window: 4
  batch {
    text_samples_per_step: 48
    vl_samples_per_step: 16
    grad_accum: 2
    text_micro_batch: 2
    vl_micro_batch: 1
    text_vl_ratio: "2:1"
  }
  curriculum { start_step: 0 max_pixels: 1003520 seq_len: 8192 }
  cost {
    vit_linear: 1
    vit_quadratic: 0.001
    llm_linear: 1
    llm_quadratic: 0.000125
    online_fit { enabled: true interval_steps: 5 min_reports: 32 lead_steps: 3 }
  }
)pb";

// One packer as tutti-packerd wires it: schedule from the record, planner,
// window, request logic.
struct Served {
  Served(std::shared_ptr<const Job> job, const std::string& record_path) : job(job) {
    auto data = ReadCostFitRecord(record_path, job->fingerprint());
    EXPECT_TRUE(data.ok()) << data.status();
    costs = std::make_unique<CostSchedule>(data->fits, data->planned_through);
    record = std::make_unique<CostFitRecord>(record_path, *data);
    record->Attach(costs.get(), 16);
    metrics = std::make_unique<PackerMetrics>(registry);
    window = std::make_unique<PlanWindow>(std::make_shared<Planner>(job, nullptr, costs.get()),
                                          PlanWindowOptions{4, 2}, metrics.get());
    packer = std::make_unique<Packer>(job, window.get(), metrics.get(), ServedPlansOptions{},
                                      costs.get());
  }
  ~Served() { window->Stop(); }

  // The step's plan as served, its hash, and a report per rank timed with
  // true quadratic constants `vit_q` and `llm_q` (1 us per linear unit).
  std::string ServeAndReport(uint64_t step, double vit_q, double llm_q) {
    auto plan = window->GetBlocking(step);
    EXPECT_TRUE(plan.ok()) << plan.status();
    v1::StepPlan wire;
    EXPECT_TRUE(BuildStepPlan(*job, **plan, {}, &wire).ok());
    if (wire.has_cost_fit()) fitted_steps[step] = wire.cost_fit().id();
    for (uint32_t r = 0; r < job->world_size(); ++r) {
      const RankFeatures f = FeaturesOf(**plan, r);
      const double vit = 1e-6 * (f.sum[kFitVit] + vit_q * f.sum_sq[kFitVit]);
      const double llm = 1e-6 * (f.sum[kFitLlm] + llm_q * f.sum_sq[kFitLlm]);
      // Every seventh report a stalled rank.
      const double stall = (step * 8 + r) % 7 == 0 ? 6.0 : 1.0;
      EXPECT_TRUE(
          packer
              ->ReportTiming(
                  {step, r, {{"vit", vit * stall}, {"llm", llm}, {"step", 1}}, job->fingerprint()})
              .ok());
    }
    return PlanHash(&wire);
  }

  std::shared_ptr<const Job> job;
  prometheus::Registry registry;
  std::unique_ptr<CostSchedule> costs;
  std::unique_ptr<CostFitRecord> record;
  std::unique_ptr<PackerMetrics> metrics;
  std::unique_ptr<PlanWindow> window;
  std::unique_ptr<Packer> packer;
  std::map<uint64_t, uint32_t> fitted_steps;  // step -> fit id its plan carried
};

class CostFitReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto job = testing::MakeJob(kConfig, testing::SyntheticIndex(testing::SmallDataset(3000)));
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *job;
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("tutti_cost_fit_replay_", ::getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    record_ = (dir_ / "cost_fits").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::shared_ptr<const Job> job_;
  std::filesystem::path dir_;
  std::string record_;
};

TEST_F(CostFitReplayTest, ARestartedPackerPlansEveryStepAsServed) {
  constexpr uint64_t kSteps = 40;
  std::map<uint64_t, std::string> first;
  uint64_t first_planned = 0;
  std::vector<CostFitEntry> fits;
  {
    Served a(job_, record_);
    for (uint64_t s = 0; s < kSteps; ++s) first[s] = a.ServeAndReport(s, 0.00025, 0.00003125);
    fits = a.costs->entries();
    first_planned = a.costs->planned_through();
    ASSERT_FALSE(fits.empty()) << "no fit was announced";
    EXPECT_GE(a.metrics->cost_fits_announced.Value(), 1);
    // The fit found the true ratios, and steps from its from_step on were
    // planned with it (and said so), the ones before without.
    const CostFitEntry& f = fits.front();
    EXPECT_NEAR(f.cost.vit_quadratic / f.cost.vit_linear, 0.00025, 0.00025 * 0.05);
    EXPECT_NEAR(f.cost.llm_quadratic / f.cost.llm_linear, 0.00003125, 0.00003125 * 0.1);
    EXPECT_GT(f.from_step, 5u);
    for (uint64_t s = 0; s < kSteps; ++s) {
      EXPECT_EQ(a.fitted_steps.count(s), s >= f.from_step ? 1u : 0u) << s;
    }
    // Steps before the fit are the config's plans exactly.
    Planner plain(job_);
    StepPlanData d;
    ASSERT_TRUE(plain.Plan(f.from_step - 1, &d).ok());
    v1::StepPlan p;
    ASSERT_TRUE(BuildStepPlan(*job_, d, {}, &p).ok());
    EXPECT_EQ(PlanHash(&p), first[f.from_step - 1]);
    ASSERT_TRUE(plain.Plan(f.from_step, &d).ok());
    ASSERT_TRUE(BuildStepPlan(*job_, d, {}, &p).ok());
    EXPECT_NE(PlanHash(&p), first[f.from_step]);
  }
  // The record holds the fits and a reservation beyond every planned step.
  auto data = ReadCostFitRecord(record_, job_->fingerprint());
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->fits.size(), fits.size());
  EXPECT_EQ(data->fits[0].cost.vit_quadratic, fits[0].cost.vit_quadratic);  // bit for bit
  EXPECT_GE(data->planned_through, first_planned);

  Served b(job_, record_);
  // Steps served again in another order (a job resumed from a checkpoint).
  for (uint64_t s = kSteps; s-- > 0;) {
    auto plan = b.window->GetBlocking(s);
    ASSERT_TRUE(plan.ok());
    v1::StepPlan wire;
    ASSERT_TRUE(BuildStepPlan(*job_, **plan, {}, &wire).ok());
    EXPECT_EQ(PlanHash(&wire), first[s]) << "step " << s;
  }
  // Its own fit (the machine changed: quadratic terms twice as heavy) lands
  // after every step the first packer may have planned.
  for (uint64_t s = kSteps; s < kSteps + 20; ++s) b.ServeAndReport(s, 0.0005, 0.0000625);
  const std::vector<CostFitEntry> after = b.costs->entries();
  ASSERT_GT(after.size(), fits.size());
  EXPECT_GE(after[fits.size()].from_step, data->planned_through);
}

TEST_F(CostFitReplayTest, ReportsThatAreNotValidAreRefusedNamingTheField) {
  Served a(job_, record_);
  ASSERT_TRUE(a.window->GetBlocking(1).ok());
  auto s = a.packer->ReportTiming({1, 0, {{"vit", NAN}}, ""});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("phase 'vit'"), std::string::npos) << s;
  s = a.packer->ReportTiming({1, 0, {{"llm", -0.5}}, ""});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = a.packer->ReportTiming({1, 0, {{"llm", 0.5}}, "0123456789abcdef"});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("config_fingerprint 0123456789abcdef"), std::string::npos) << s;
  EXPECT_EQ(a.metrics->timing_rejected.Value(), 3);
  // Timings unrelated to the plans: every round refuses, nothing is
  // announced and the steps keep the config's constants.
  for (uint64_t step = 0; step < 30; ++step) {
    ASSERT_TRUE(a.window->GetBlocking(step).ok());
    for (uint32_t r = 0; r < 8; ++r) {
      const double noise = std::fmod((step * 8 + r) * 0.6180339887, 1.0);
      ASSERT_TRUE(a.packer->ReportTiming({step, r, {{"vit", noise}, {"llm", 1 - noise}}, ""}).ok());
    }
  }
  EXPECT_GE(a.metrics->cost_fits_refused.Value(), 1);
  EXPECT_EQ(a.metrics->cost_fits_announced.Value(), 0);
  EXPECT_TRUE(a.costs->entries().empty());
}

TEST_F(CostFitReplayTest, AnotherJobsRecordIsRefused) {
  { Served a(job_, record_); }
  ASSERT_TRUE(std::filesystem::exists(record_) ||
              WriteFileAtomically(record_, FormatCostFitRecord({job_->fingerprint(), 0, {}})).ok());
  auto other = ReadCostFitRecord(record_, "ffffffffffffffff");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find("belongs to the job"), std::string::npos);
  ASSERT_TRUE(
      WriteFileAtomically(record_, "job x\nfit 1 5 vit 0x1p+0 nan llm 1 1 audio 1 1\n").ok());
  EXPECT_EQ(ReadCostFitRecord(record_, "").status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace tutti::packer
