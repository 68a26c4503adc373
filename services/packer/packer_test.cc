// The request logic and the plan window, without a network.
#include "services/packer/packer.h"

#include <prometheus/registry.h>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "services/packer/plan_proto.h"
#include "services/packer/testing/jobs.h"

namespace tutti::packer {
namespace {

using testing::kBaseConfig;
using testing::MakeJob;
using testing::SmallDataset;
using testing::SyntheticIndex;

class PackerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto job = MakeJob(std::string(kBaseConfig) + " epochs: 2 plan_window: 4",
                       SyntheticIndex(SmallDataset(2000)));
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *job;
    metrics_ = std::make_unique<PackerMetrics>(registry_);
    window_ = std::make_unique<PlanWindow>(std::make_shared<Planner>(job_), PlanWindowOptions{4, 2},
                                           metrics_.get());
    packer_ = std::make_unique<Packer>(job_, window_.get(), metrics_.get());
  }

  absl::Status Get(uint64_t step, const ClientView& c, v1::StepPlan* plan) {
    absl::Notification n;
    absl::Status out;
    packer_->GetPlan(step, c, plan, [&](absl::Status s) {
      out = s;
      n.Notify();
    });
    n.WaitForNotification();
    return out;
  }

  prometheus::Registry registry_;
  std::shared_ptr<const Job> job_;
  std::unique_ptr<PackerMetrics> metrics_;
  std::unique_ptr<PlanWindow> window_;
  std::unique_ptr<Packer> packer_;
};

TEST_F(PackerTest, ServesThePlannersPlansAndPlansAhead) {
  v1::StepPlan served;
  ASSERT_TRUE(Get(3, {}, &served).ok());
  Planner planner(job_);
  StepPlanData d;
  ASSERT_TRUE(planner.Plan(3, &d).ok());
  v1::StepPlan direct;
  ASSERT_TRUE(BuildStepPlan(*job_, d, {}, &direct).ok());
  EXPECT_EQ(PlanHash(&served), PlanHash(&direct));
  EXPECT_GT(served.stats().plan_seconds(), 0);
  // The window plans steps 3..6 ahead of the client.
  for (int i = 0; i < 200 && window_->Peek(6) == nullptr; ++i)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_NE(window_->Peek(6), nullptr);
  EXPECT_EQ(window_->Peek(7), nullptr);
  EXPECT_EQ(window_->head(), 3u);
  EXPECT_GE(metrics_->steps_planned.Value(), 4);
  EXPECT_GT(metrics_->samples_planned.Value(), 0);
}

// Post-balancing's statistics reach the metrics, step by step.
TEST(PackerMetricsTest, PostBalancingPhasesAndExchangeBytesAreExposed) {
  auto job = MakeJob(std::string(kBaseConfig) + " post_balancing { enabled: true }",
                     SyntheticIndex(SmallDataset(2000)));
  ASSERT_TRUE(job.ok()) << job.status();
  prometheus::Registry registry;
  PackerMetrics metrics(registry);
  PlanWindow window(std::make_shared<Planner>(*job), PlanWindowOptions{1, 1}, &metrics);
  auto plan = window.GetBlocking(5);
  ASSERT_TRUE(plan.ok()) << plan.status();
  window.Stop();  // nothing planned after step 5's plan is read below
  // The last step planned may be 5 or the one after: compare with it.
  const StepPlanData* last = plan->get();
  for (uint64_t s = 6; s < 8; ++s) {
    if (auto p = window.Peek(s)) last = p.get();
  }
  EXPECT_EQ(metrics.imbalance_vit.Value(), last->vit.imbalance);
  EXPECT_EQ(metrics.imbalance_llm.Value(), last->llm.imbalance);
  EXPECT_EQ(metrics.imbalance_before_vit.Value(), last->vit.imbalance_before);
  EXPECT_EQ(metrics.imbalance_before_llm.Value(), last->llm.imbalance_before);
  EXPECT_LT(metrics.imbalance_vit.Value(), metrics.imbalance_before_vit.Value());
  const double steps = metrics.steps_planned.Value();
  EXPECT_GE(steps, 1);
  for (prometheus::Histogram* h : {&metrics.inter_node_bytes, &metrics.intra_node_bytes,
                                   &metrics.remote_load_bytes, &metrics.plan_seconds}) {
    EXPECT_EQ(h->Collect().histogram.sample_count, steps);
  }
  EXPECT_EQ(metrics.rearrangement_fast.Value(), steps);
  EXPECT_GT(metrics.intra_node_bytes.Collect().histogram.sample_sum +
                metrics.inter_node_bytes.Collect().histogram.sample_sum,
            0);
}

TEST_F(PackerTest, ClientMismatchesAreRefused) {
  v1::StepPlan plan;
  ClientView c;
  c.world_size = 8;
  absl::Status s = Get(0, c, &plan);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("world_size 8"), std::string::npos) << s;
  EXPECT_NE(s.message().find("world_size is 8"), std::string::npos) << s;
  c = {};
  c.config_fingerprint = "0123456789abcdef";
  s = Get(0, c, &plan);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("0123456789abcdef"), std::string::npos);
  c = {};
  c.ranks = {0, 9};
  s = Get(0, c, &plan);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rank 9"), std::string::npos);
  s = Get(job_->total_steps(), {}, &plan);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("raise epochs"), std::string::npos);
  c = {};
  c.world_size = 4;
  c.config_fingerprint = job_->fingerprint();
  c.ranks = {3};
  EXPECT_TRUE(Get(0, c, &plan).ok());
  EXPECT_EQ(plan.ranks_size(), 1);
}

TEST_F(PackerTest, StreamBounds) {
  EXPECT_EQ(*packer_->StreamEnd(0, 0), job_->total_steps());
  EXPECT_EQ(*packer_->StreamEnd(0, 5), 5u);
  EXPECT_EQ(*packer_->StreamEnd(2, job_->total_steps() + 100), job_->total_steps());
  EXPECT_EQ(packer_->StreamEnd(5, 5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(packer_->StreamEnd(job_->total_steps(), 0).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST_F(PackerTest, TimingReportsAreValidated) {
  v1::StepPlan plan;
  ASSERT_TRUE(Get(1, {}, &plan).ok());
  EXPECT_TRUE(packer_->ReportTiming({1, 2, {{"vit", 0.5}, {"llm", 1.5}, {"step", 2.1}}}).ok());
  EXPECT_GT(metrics_->fitted_llm.Value(), 0);
  EXPECT_EQ(packer_->ReportTiming({1, 4, {{"vit", 0.5}}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(packer_->ReportTiming({job_->total_steps(), 0, {}}).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(packer_->ReportTiming({1, 0, {{"vit", -1}}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(packer_->ReportTiming({1, 0, {{"", 1}}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(metrics_->timing_accepted.Value(), 1);
  EXPECT_EQ(metrics_->timing_rejected.Value(), 4);
}

TEST_F(PackerTest, StopFailsWaitersCleanly) {
  window_->Stop();
  v1::StepPlan plan;
  EXPECT_EQ(Get(0, {}, &plan).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tutti::packer
