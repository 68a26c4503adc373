// The request logic and the plan window, without a network; the service's
// per-connection state over rounds of plan streams through a real gRPC server.
#include "services/packer/packer.h"

#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"
#include "common/rank_identity.h"
#include "common/rpc_gate.h"
#include "gtest/gtest.h"
#include "services/packer/packer_service.h"
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

  absl::StatusOr<Packer::PlanBytes> GetBytes(uint64_t step, const ClientView& c) {
    absl::Notification n;
    absl::StatusOr<Packer::PlanBytes> out;
    packer_->GetPlanBytes(step, c, [&](absl::StatusOr<Packer::PlanBytes> b) {
      out = std::move(b);
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
  // The window plans steps 3..6 ahead of the client. Two workers finish them
  // in any order, so wait for every one of them, not only the last.
  auto all_planned = [&] {
    for (uint64_t s = 3; s <= 6; ++s) {
      if (window_->Peek(s) == nullptr) return false;
    }
    return true;
  };
  for (int i = 0; i < 500 && !all_planned(); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(all_planned());
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
  // Without locality the locality metrics stay at zero.
  EXPECT_EQ(metrics.locality_local_items.Value() + metrics.locality_remote_items.Value(), 0);
  EXPECT_EQ(metrics.locality_remote_member_bytes.Collect().histogram.sample_count, 0u);
}

// With shard homes every input planned is counted local or remote, and each
// step's remote member bytes and ViT balance are exposed.
TEST(PackerMetricsTest, LocalityCountsLocalAndRemoteInputs) {
  auto job = MakeJob(std::string(kBaseConfig) +
                         " post_balancing { enabled: true } locality { home_replication: 1 }",
                     SyntheticIndex(SmallDataset(2000)));
  ASSERT_TRUE(job.ok()) << job.status();
  prometheus::Registry registry;
  PackerMetrics metrics(registry);
  PlanWindow window(std::make_shared<Planner>(*job), PlanWindowOptions{1, 1}, &metrics);
  ASSERT_TRUE(window.GetBlocking(3).ok());
  window.Stop();
  const double steps = metrics.steps_planned.Value();
  ASSERT_GE(steps, 1);
  // 2 nodes, one home each shard: some inputs are remote, most are not.
  EXPECT_GT(metrics.locality_remote_items.Value(), 0);
  EXPECT_GT(metrics.locality_local_items.Value(), metrics.locality_remote_items.Value());
  const auto bytes = metrics.locality_remote_member_bytes.Collect().histogram;
  EXPECT_EQ(bytes.sample_count, steps);
  EXPECT_GT(bytes.sample_sum, 0);
  EXPECT_GE(metrics.locality_vit_over_lower_bound.Value(), 1.0);
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

TEST_F(PackerTest, KeptBytesAreTheBuiltPlanAndAreServedAgainWithoutACopy) {
  ClientView c;
  c.ranks = {2, 1, 2};
  auto first = GetBytes(3, c);
  ASSERT_TRUE(first.ok()) << first.status();
  v1::StepPlan served;
  ASSERT_TRUE(served.ParseFromString(**first));
  auto data = window_->GetBlocking(3);
  ASSERT_TRUE(data.ok());
  v1::StepPlan direct;
  ASSERT_TRUE(BuildStepPlan(*job_, **data, std::vector<uint32_t>{1, 2}, &direct).ok());
  EXPECT_EQ(PlanHash(&served), PlanHash(&direct));
  EXPECT_EQ(served.stats().plan_seconds(), (*data)->plan_seconds);
  c.ranks = {1, 2};  // the same rank set
  auto again = GetBytes(3, c);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), first->get());
  EXPECT_EQ(metrics_->served_cache_misses.Value(), 1);
  EXPECT_EQ(metrics_->served_cache_hits.Value(), 1);
  EXPECT_EQ(metrics_->served_cache_bytes.Value(), static_cast<double>((*first)->size()));
  c.ranks = {9};
  EXPECT_EQ(GetBytes(3, c).status().code(), absl::StatusCode::kInvalidArgument);
}

// An answer is the kept bytes themselves: one slice over them (no copy per
// answer), holding them while gRPC sends it and letting go once it is gone.
TEST_F(PackerTest, AnAnswerReferencesTheKeptBytesUntilItIsSent) {
  ClientView c;
  c.ranks = {0, 3};
  auto kept = GetBytes(2, c);
  ASSERT_TRUE(kept.ok()) << kept.status();
  const long held_before = kept->use_count();
  {
    grpc::ByteBuffer answer = AsByteBuffer(*kept);
    EXPECT_EQ(kept->use_count(), held_before + 1);
    grpc::ByteBuffer copy = answer;  // as gRPC holds it while writing
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(copy.Dump(&slices).ok());
    ASSERT_EQ(slices.size(), 1u);
    EXPECT_EQ(static_cast<const void*>(slices[0].begin()),
              static_cast<const void*>((*kept)->data()));
    EXPECT_EQ(slices[0].size(), (*kept)->size());
    EXPECT_EQ(answer.Length(), (*kept)->size());
    answer.Clear();
    slices.clear();
    EXPECT_EQ(kept->use_count(), held_before + 1);  // the copy still holds them
  }
  EXPECT_EQ(kept->use_count(), held_before);
}

// Requests for a plan not yet built, arriving together (as the clients of a
// new step do): one builds it, the others wait for that build and get the
// same bytes.
TEST_F(PackerTest, RequestsArrivingTogetherBuildAPlanOnce) {
  constexpr int kRequests = 8;
  ClientView c;
  c.ranks = {3};
  absl::Mutex mu;
  std::vector<Packer::PlanBytes> got;
  absl::BlockingCounter left(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    packer_->GetPlanBytes(6, c, [&](absl::StatusOr<Packer::PlanBytes> b) {
      ASSERT_TRUE(b.ok()) << b.status();
      {
        absl::MutexLock l(&mu);
        got.push_back(*b);
      }
      left.DecrementCount();
    });
  }
  left.Wait();
  ASSERT_EQ(got.size(), static_cast<size_t>(kRequests));
  for (const auto& b : got) EXPECT_EQ(b.get(), got[0].get());
  EXPECT_EQ(metrics_->served_cache_misses.Value(), 1);
  EXPECT_EQ(metrics_->served_cache_hits.Value() + metrics_->served_cache_joined.Value(),
            kRequests - 1);
  EXPECT_EQ(packer_->served_plans().building(), 0u);
}

// With precomputing on, the served bytes of every node's ranks and of every
// rank are built as the window plans each step, before any client asks: a
// job's first requests after a start are answered from kept bytes (the
// same bytes a request would build), within the budget.
TEST_F(PackerTest, PlannedStepsAreServedFromPrecomputedBytes) {
  prometheus::Registry registry;
  PackerMetrics metrics(registry);
  PlanWindow window(std::make_shared<Planner>(job_), PlanWindowOptions{4, 2}, &metrics);
  ServedPlansOptions so;
  so.precompute = kPrecomputeNodes | kPrecomputeRanks;
  Packer packer(job_, &window, &metrics, so);
  const std::vector<std::vector<uint32_t>> keys = {{0, 1}, {2, 3}, {0}, {1}, {2}, {3}};
  ASSERT_TRUE(window.GetBlocking(0).ok());  // a start: the window plans steps 0..3
  auto all_kept = [&](uint64_t step) {
    for (const auto& k : keys) {
      if (packer.served_plans().Find(step, k) == nullptr) return false;
    }
    return true;
  };
  // Every planned step's bytes, whatever order the window's threads finish in
  // (under a sanitizer steps 1 and 2 can still be building once 0 and 3 are kept).
  auto done = [&] {
    for (uint64_t step = 0; step < 4; ++step) {
      if (!all_kept(step)) return false;
    }
    return metrics.served_precomputed.Value() >= 4 * keys.size();
  };
  for (int i = 0; i < 6000 && !done(); ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(all_kept(0) && all_kept(3));
  EXPECT_EQ(metrics.served_precomputed.Value(), 4 * keys.size());
  for (uint64_t step : {0, 3}) {
    auto data = window.GetBlocking(step);
    ASSERT_TRUE(data.ok());
    for (const auto& k : keys) {
      ClientView c;
      c.ranks = k;
      absl::Notification n;
      absl::StatusOr<Packer::PlanBytes> got;
      packer.GetPlanBytes(step, c, [&](absl::StatusOr<Packer::PlanBytes> b) {
        got = std::move(b);
        n.Notify();
      });
      n.WaitForNotification();
      ASSERT_TRUE(got.ok()) << got.status();
      v1::StepPlan served, direct;
      ASSERT_TRUE(served.ParseFromString(**got));
      ASSERT_TRUE(BuildStepPlan(*job_, **data, k, &direct).ok());
      EXPECT_EQ(PlanHash(&served), PlanHash(&direct)) << "step " << step;
      EXPECT_EQ(served.stats().plan_seconds(), (*data)->plan_seconds);
    }
  }
  EXPECT_EQ(metrics.served_cache_misses.Value(), 0);
  EXPECT_EQ(metrics.served_cache_hits.Value(), 2 * keys.size());

  // A budget with room for a few plans: the precompute stops there.
  prometheus::Registry small_registry;
  PackerMetrics small_metrics(small_registry);
  PlanWindow small_window(std::make_shared<Planner>(job_), PlanWindowOptions{4, 2},
                          &small_metrics);
  so.max_bytes = 3 * packer.served_plans().Find(0, {0, 1})->size();
  Packer small(job_, &small_window, &small_metrics, so);
  ASSERT_TRUE(small_window.GetBlocking(0).ok());
  for (int i = 0; i < 6000 && small_metrics.served_precomputed.Value() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_LE(small.served_plans().bytes(), so.max_bytes);
  EXPECT_GT(small.served_plans().entries(), 0u);
  EXPECT_LT(small.served_plans().entries(), 4 * keys.size());
}

// Rounds of concurrent plan streams, each client on its own connection, as
// `tutti bench load` runs them: after every round the packer's table of
// connections holding streams is empty again, and what it keeps (the
// serialized plans) is the same after the last round as after the first.
TEST_F(PackerTest, RoundsOfStreamsLeaveNoPerConnectionStateBehind) {
  RpcGate gate(RpcGateOptions{}, "tutti.v1.Packer", nullptr);
  RankIdentities ranks(false);
  ranks.SetJob(job_->config().job_id());
  PackerService service(packer_.get(), &gate, &ranks, 2);
  int port = 0;
  auto server = StartGrpcServer("127.0.0.1:0", {&service}, &port);
  ASSERT_TRUE(server.ok()) << server.status();
  constexpr int kClients = 8, kRounds = 4;
  std::vector<std::unique_ptr<v1::Packer::Stub>> stubs;
  for (int i = 0; i < kClients; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection each
    stubs.push_back(v1::Packer::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args)));
  }
  uint64_t kept_after_first = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::thread> threads;
    for (int i = 0; i < kClients; ++i) {
      threads.emplace_back([&, i] {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        v1::StreamPlansRequest req;
        req.set_start_step(i % 3);
        req.set_end_step(i % 3 + 3);
        req.add_ranks(i % 4);
        auto reader = stubs[i]->StreamPlans(&ctx, req);
        v1::StepPlan plan;
        int got = 0;
        while (reader->Read(&plan)) {
          EXPECT_EQ(plan.step(), static_cast<uint64_t>(i % 3 + got));
          ++got;
        }
        EXPECT_TRUE(reader->Finish().ok());
        EXPECT_EQ(got, 3);
      });
    }
    for (auto& t : threads) t.join();
    // A stream's server side ends just after its client saw the status.
    for (int i = 0; i < 500 && service.clients_with_streams() != 0; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(service.clients_with_streams(), 0u) << "round " << round;
    if (round == 0) kept_after_first = packer_->served_plans().bytes();
  }
  EXPECT_GT(kept_after_first, 0u);
  EXPECT_EQ(packer_->served_plans().bytes(), kept_after_first);
  std::set<std::pair<int, int>> asked;  // (step, rank)
  for (int i = 0; i < kClients; ++i) {
    for (int s = i % 3; s < i % 3 + 3; ++s) asked.insert({s, i % 4});
  }
  EXPECT_EQ(packer_->served_plans().entries(), asked.size());
  EXPECT_EQ(metrics_->served_stream.Value(), kClients * kRounds * 3);
  (*server)->Shutdown();
}

}  // namespace
}  // namespace tutti::packer
