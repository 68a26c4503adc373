// The serialized plans the packer keeps, and the packer's per-connection
// state over repeated rounds of plan streams through a real gRPC server.
#include "services/packer/served_plans.h"

#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"
#include "common/rank_identity.h"
#include "common/rpc_gate.h"
#include "gtest/gtest.h"
#include "services/packer/packer.h"
#include "services/packer/packer_service.h"
#include "services/packer/plan_proto.h"
#include "services/packer/testing/jobs.h"
#include "tutti/v1/packer.grpc.pb.h"

namespace tutti::packer {
namespace {

using testing::kBaseConfig;
using testing::MakeJob;
using testing::SmallDataset;
using testing::SyntheticIndex;

ServedPlans::Bytes Bytes(size_t n) { return std::make_shared<const std::string>(n, 'x'); }

TEST(ServedPlansTest, KeysAreSortedWithoutDuplicates) {
  EXPECT_EQ(ServedPlans::Key(std::vector<uint32_t>{3, 1, 3, 2}), (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_TRUE(ServedPlans::Key({}).empty());
}

TEST(ServedPlansTest, TheFirstBytesKeptAreServedAgain) {
  ServedPlans p({.max_bytes = 1000, .keep_behind = 4});
  EXPECT_EQ(p.Find(1, {0}), nullptr);
  auto a = Bytes(10);
  EXPECT_EQ(p.Insert(1, {0}, a), a);
  EXPECT_EQ(p.Insert(1, {0}, Bytes(10)), a);  // built twice at once: one is kept
  EXPECT_EQ(p.Find(1, {0}), a);
  EXPECT_EQ(p.Find(1, {1}), nullptr);
  EXPECT_EQ(p.Find(2, {0}), nullptr);
  EXPECT_EQ(p.bytes(), 10u);
  EXPECT_EQ(p.entries(), 1u);
}

TEST(ServedPlansTest, StepsBehindTheWindowAndBytesOverTheBudgetAreDropped) {
  ServedPlans p({.max_bytes = 100, .keep_behind = 2});
  for (uint64_t s = 0; s < 3; ++s) p.Insert(s, {0}, Bytes(10));
  EXPECT_EQ(p.steps(), 3u);
  p.Insert(5, {0}, Bytes(10));  // steps 0..2 are more than 2 behind 5
  EXPECT_EQ(p.steps(), 1u);
  EXPECT_EQ(p.bytes(), 10u);
  EXPECT_EQ(p.Find(2, {0}), nullptr);
  auto late = Bytes(10);
  EXPECT_EQ(p.Insert(1, {0}, late), late);  // served, not kept
  EXPECT_EQ(p.Find(1, {0}), nullptr);
  // Over the budget: the lowest step goes first, the one being added last.
  for (uint32_t r = 1; r < 5; ++r) p.Insert(4, {r}, Bytes(10));
  EXPECT_EQ(p.bytes(), 50u);
  p.Insert(5, {1}, Bytes(60));
  EXPECT_EQ(p.Find(4, {1}), nullptr);
  EXPECT_NE(p.Find(5, {1}), nullptr);
  EXPECT_EQ(p.bytes(), 70u);
  // A step alone over the budget: what does not fit is served, not kept.
  EXPECT_EQ(p.Insert(5, {2}, Bytes(40))->size(), 40u);
  EXPECT_EQ(p.Find(5, {2}), nullptr);
  EXPECT_LE(p.bytes(), 100u);
  EXPECT_EQ(p.Insert(6, {0}, Bytes(101))->size(), 101u);
  EXPECT_EQ(p.Find(6, {0}), nullptr);
}

class ServedPlansPackerTest : public ::testing::Test {
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

TEST_F(ServedPlansPackerTest, KeptBytesAreTheBuiltPlanAndAreServedAgainWithoutACopy) {
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

// Rounds of concurrent plan streams, each client on its own connection, as
// `tutti bench load` runs them: after every round the packer's table of
// connections holding streams is empty again, and what it keeps (the
// serialized plans) is the same after the last round as after the first.
TEST_F(ServedPlansPackerTest, RoundsOfStreamsLeaveNoPerConnectionStateBehind) {
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
