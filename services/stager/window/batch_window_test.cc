#include "services/stager/window/batch_window.h"

#include <optional>

#include "gtest/gtest.h"
#include "services/stager/window/batch_window_test_rig.h"

namespace tutti::stager {
namespace {

using window_test::Answer;
using window_test::Rig;
using window_test::RunAnswers;
using window_test::TestBatch;

TEST(BatchWindowTest, ABatchIsBuiltOnceItsShardsAreStagedAndHandedToTheWaitingClient) {
  Rig rig;
  BatchWindow::Callbacks cbs;
  Answer a;
  bool moved = true;
  ASSERT_TRUE(rig.window.Admit(0, 2, &moved).ok());
  EXPECT_FALSE(moved);
  rig.window.Acquire(0, 2, 0, rig.now, a.Callback(), &cbs);
  rig.Plan(0);
  rig.Round(&cbs);
  EXPECT_TRUE(rig.batches.empty());  // its shard is still pending
  rig.shards["s0.tar"] = ShardState::kStaged;
  rig.Round(&cbs);
  ASSERT_EQ(rig.batches.size(), 2u);
  EXPECT_TRUE(rig.batches.at({0, 2})->started_);
  EXPECT_EQ(rig.window.memory(), 200u);
  EXPECT_EQ(rig.window.InUse(), "rank 2 waits for step 0");
  rig.Built(0, 2, &cbs);
  RunAnswers(cbs);
  ASSERT_TRUE(a.got.has_value() && a.got->ok());
  EXPECT_EQ((*a.got)->step(), 0u);
  EXPECT_EQ(rig.window.InUse(), "rank 2 holds step 0");
  // The window moves on once both ranks released step 0.
  rig.window.Release(0, 2, &cbs);
  EXPECT_TRUE(rig.batches.at({0, 2})->discarded_);
  EXPECT_EQ(rig.window.base(), 0u);
  rig.window.Release(0, 3, &cbs);
  EXPECT_EQ(rig.window.base(), 1u);
  EXPECT_EQ(rig.window.memory(), 0u);
}

TEST(BatchWindowTest, AStepWhoseShardsNeverArriveIsBuiltAfterTheStageWait) {
  Rig rig;
  BatchWindow::Callbacks cbs;
  rig.Plan(0);
  rig.Round(&cbs);
  EXPECT_TRUE(rig.batches.empty());
  rig.now += absl::Seconds(10);
  rig.Round(&cbs);
  EXPECT_EQ(rig.batches.size(), 2u);  // reads go to the source
}

TEST(BatchWindowTest, OnlyStepsInsideTheWindowAreBuilt) {
  Rig rig;
  BatchWindow::Callbacks cbs;
  for (uint64_t s = 0; s < 4; ++s) {
    rig.Plan(s);
    rig.shards[absl::StrCat("s", s, ".tar")] = ShardState::kStaged;
  }
  rig.Round(&cbs);
  EXPECT_EQ(rig.batches.size(), 4u);  // steps 0 and 1, two ranks each
  EXPECT_FALSE(rig.batches.count({2, 2}));
  std::set<std::string> pinned, open;
  ASSERT_TRUE(rig.window.TakeShardSets(&pinned, &open));
  EXPECT_EQ(pinned.size(), 4u);  // every planned step's shards stay in the cache
  EXPECT_EQ(open, (std::set<std::string>{"s0.tar", "s1.tar"}));
  EXPECT_FALSE(rig.window.TakeShardSets(&pinned, &open));  // nothing changed since
}

TEST(BatchWindowTest, BatchesWaitForTheMemoryBudgetAndOneOverItFailsNamingTheFlag) {
  Rig rig;
  BatchWindow::Callbacks cbs;
  rig.batch_bytes = 600;  // one at a time fits in 1000
  rig.Plan(0);
  rig.shards["s0.tar"] = ShardState::kStaged;
  rig.Round(&cbs);
  EXPECT_EQ(rig.Started(), 1u);
  EXPECT_EQ(rig.window.memory(), 600u);
  Answer a;
  rig.window.Acquire(0, 3, 1000, rig.now, a.Callback(), &cbs);
  rig.now += absl::Seconds(2);
  rig.Round(&cbs);
  RunAnswers(cbs);
  ASSERT_TRUE(a.got.has_value());
  EXPECT_EQ(a.got->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(a.got->status().message().find("or for the memory budget (600 of 1000 bytes used)"),
            std::string::npos)
      << a.got->status();
  rig.Built(0, 2, &cbs);
  rig.window.Release(0, 2, &cbs);
  rig.Round(&cbs);
  EXPECT_EQ(rig.Started(), 2u);  // rank 3's batch started once rank 2's was released

  Rig big;
  big.batch_bytes = 1001;
  big.Plan(0);
  big.shards["s0.tar"] = ShardState::kStaged;
  Answer b;
  big.window.Acquire(0, 2, 0, big.now, b.Callback(), &cbs);
  big.Round(&cbs);
  RunAnswers(cbs);
  ASSERT_TRUE(b.got.has_value());
  EXPECT_EQ(b.got->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.got->status().message().find("raise --memory_budget"), std::string::npos);
}

TEST(BatchWindowTest, AClientTimingOutIsToldWhatItsBatchWaitsFor) {
  Rig rig;
  BatchWindow::Callbacks cbs;
  ASSERT_TRUE(rig.intake.Take(v1::StepPlan()).ok());  // step 0's plan has come
  Answer a;
  rig.window.Acquire(1, 2, 3000, rig.now, a.Callback(), &cbs);
  rig.now += absl::Seconds(2);
  rig.Round(&cbs);
  EXPECT_TRUE(cbs.empty());
  rig.now += absl::Seconds(1);
  rig.Round(&cbs);
  RunAnswers(cbs);
  ASSERT_TRUE(a.got.has_value());
  EXPECT_EQ(a.got->status().message(),
            "the batch for step 1 rank 2 was not ready within 3s: no plan for step 1 from the "
            "packer yet (plans received up to step 0)");
}

TEST(BatchWindowTest, SlotsWaitingForAPlanFailWithThePackersError) {
  Rig rig;
  BatchWindow::Callbacks cbs;
  Answer a;
  rig.window.Acquire(1, 3, 0, rig.now, a.Callback(), &cbs);
  rig.intake.Failed(1, absl::OutOfRangeError("past the end of the dataset"), 0);
  rig.Round(&cbs);
  RunAnswers(cbs);
  ASSERT_TRUE(a.got.has_value());
  EXPECT_EQ(a.got->status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(a.got->status().message(),
            "the packer cannot serve step 1: past the end of the dataset");
}

TEST(BatchWindowTest, APlanWithoutThisRanksPlanOrOfAnotherJobFailsItsSlots) {
  Rig rig;
  BatchWindow::Callbacks cbs;
  rig.Plan(0, {2});
  Answer a;
  rig.window.Acquire(0, 3, 0, rig.now, a.Callback(), &cbs);
  RunAnswers(cbs);
  ASSERT_TRUE(a.got.has_value());
  EXPECT_NE(a.got->status().message().find("has no RankPlan for rank 3 (node 1)"),
            std::string::npos)
      << a.got->status();
  rig.Plan(1, {2, 3}, absl::FailedPreconditionError("another config"));
  Answer b;
  rig.window.Acquire(1, 2, 0, rig.now, b.Callback(), &cbs);
  RunAnswers(cbs);
  ASSERT_TRUE(b.got.has_value());
  EXPECT_EQ(b.got->status().message(), "another config");
}

TEST(BatchWindowTest, ARankAskingForALaterStepGivesUpItsEarlierOnes) {
  Rig rig;
  BatchWindow::Callbacks cbs;
  rig.Plan(0);
  rig.Plan(1);
  rig.shards["s0.tar"] = rig.shards["s1.tar"] = ShardState::kStaged;
  rig.Round(&cbs);
  Answer a;
  rig.window.Acquire(1, 2, 0, rig.now, a.Callback(), &cbs);
  EXPECT_TRUE(rig.batches.at({0, 2})->discarded_);  // rank 2 never takes step 0
  bool moved = false;
  absl::Status again = rig.window.Admit(0, 2, &moved);
  EXPECT_EQ(again.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(again.message().find("batches are handed out once, in step order"), std::string::npos);
  Answer b;
  rig.window.Acquire(1, 3, 0, rig.now, b.Callback(), &cbs);
  EXPECT_EQ(rig.window.base(), 1u);  // every rank gave step 0 up
}

TEST(BatchWindowTest, TheWindowMovesToAResumedStepOnlyWhenNothingIsInUse) {
  Rig rig;
  BatchWindow::Callbacks cbs;
  bool moved = false;
  ASSERT_TRUE(rig.window.Admit(10, 2, &moved).ok());
  EXPECT_TRUE(moved);
  EXPECT_EQ(rig.window.base(), 10u);
  rig.Plan(10);
  rig.shards["s10.tar"] = ShardState::kStaged;
  rig.Round(&cbs);
  rig.Built(10, 2, &cbs);
  Answer a;
  rig.window.Acquire(10, 2, 0, rig.now, a.Callback(), &cbs);
  RunAnswers(cbs);
  ASSERT_TRUE(a.got.has_value() && a.got->ok());
  // Rank 2 holds step 10: a step before the window, or far beyond it, does
  // not move it; the request waits (and times out saying why).
  ASSERT_TRUE(rig.window.Admit(3, 3, &moved).ok());
  EXPECT_FALSE(moved);
  Answer back, far;
  rig.window.Acquire(3, 3, 1000, rig.now, back.Callback(), &cbs);
  ASSERT_TRUE(rig.window.Admit(14, 3, &moved).ok());
  EXPECT_FALSE(moved);
  rig.window.Acquire(14, 3, 1000, rig.now, far.Callback(), &cbs);
  rig.now += absl::Seconds(2);
  rig.Round(&cbs);
  RunAnswers(cbs);
  ASSERT_TRUE(back.got.has_value() && far.got.has_value());
  EXPECT_EQ(back.got->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(back.got->status().message().find("outside the window"), std::string::npos)
      << back.got->status();
  EXPECT_NE(back.got->status().message().find("rank 2 holds step 10"), std::string::npos)
      << back.got->status();
  EXPECT_EQ(far.got->status().code(), absl::StatusCode::kDeadlineExceeded);
  // Once rank 2 releases it, a step before the window moves it there.
  rig.window.Release(10, 2, &cbs);
  ASSERT_TRUE(rig.window.Admit(3, 3, &moved).ok());
  EXPECT_TRUE(moved);
  EXPECT_TRUE(rig.batches.at({10, 3})->discarded_);
  EXPECT_EQ(rig.window.memory(), 0u);
  // A waiting request is let in when the window becomes free to move.
  Rig wait;
  ASSERT_TRUE(wait.window.Admit(10, 2, &moved).ok());
  wait.Plan(10);
  wait.shards["s10.tar"] = ShardState::kStaged;
  wait.Round(&cbs);
  wait.Built(10, 2, &cbs);
  Answer held, early;
  wait.window.Acquire(10, 2, 0, wait.now, held.Callback(), &cbs);
  RunAnswers(cbs);
  ASSERT_TRUE(wait.window.Admit(3, 3, &moved).ok());
  wait.window.Acquire(3, 3, 5000, wait.now, early.Callback(), &cbs);
  EXPECT_FALSE(early.got.has_value());
  wait.window.Release(10, 2, &cbs);  // nothing in use now: the window moves to step 3
  uint64_t to = 0;
  EXPECT_TRUE(wait.window.TakeMoved(&to));
  EXPECT_EQ(to, 3u);
  wait.Plan(3);
  wait.shards["s3.tar"] = ShardState::kStaged;
  wait.Round(&cbs);
  wait.Built(3, 3, &cbs);
  RunAnswers(cbs);
  ASSERT_TRUE(early.got.has_value());
  EXPECT_TRUE(early.got->ok()) << early.got->status();

  BatchWindowOptions o = Rig::Options();
  o.total_steps = 5;
  Rig ends(o);
  EXPECT_EQ(ends.window.Admit(5, 2, &moved).code(), absl::StatusCode::kOutOfRange);
}

TEST(BatchWindowTest, ReleaseWhileWaitedForAndShutdownAnswerEveryClient) {
  Rig rig;
  BatchWindow::Callbacks cbs;
  Answer a, b;
  rig.window.Acquire(0, 2, 0, rig.now, a.Callback(), &cbs);
  rig.window.Acquire(0, 3, 0, rig.now, b.Callback(), &cbs);
  rig.window.Release(0, 2, &cbs);
  RunAnswers(cbs);
  ASSERT_TRUE(a.got.has_value());
  EXPECT_EQ(a.got->status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_FALSE(b.got.has_value());
  rig.window.FailWaiters(absl::UnavailableError("shutting down"), &cbs);
  RunAnswers(cbs);
  ASSERT_TRUE(b.got.has_value());
  EXPECT_EQ(b.got->status().code(), absl::StatusCode::kUnavailable);
}

TEST(BatchWindowTest, OverdueBuildsAreExpiredAndStaleOnesRefused) {
  Rig rig;
  BatchWindow::Callbacks cbs;
  rig.Plan(0);
  rig.shards["s0.tar"] = ShardState::kFailed;  // failed shards do not hold a step back
  rig.Round(&cbs);
  ASSERT_EQ(rig.batches.size(), 2u);
  rig.now = absl::UnixEpoch() + absl::Seconds(7);  // past the batch's deadline + 1 s
  rig.Round(&cbs);
  EXPECT_TRUE(rig.batches.at({0, 2})->expired_);
  auto stale = std::make_shared<TestBatch>(0, 2, 1);  // not the slot's batch
  EXPECT_FALSE(rig.window.Ready(stale, rig.now, &cbs));
}

TEST(BatchWindowTest, ANewIncarnationReclaimsOnlyItsOwnRanksBatches) {
  Rig rig;
  BatchWindow::Callbacks cbs;
  bool moved = false;
  rig.window.NewProcess(2, 0xA2, &cbs);
  rig.window.NewProcess(3, 0xA3, &cbs);
  rig.Plan(0);
  rig.shards["s0.tar"] = ShardState::kStaged;
  rig.Round(&cbs);
  rig.Built(0, 2, &cbs);
  rig.Built(0, 3, &cbs);
  Answer a2, a3;
  for (auto [r, a] : {std::pair{2u, &a2}, {3u, &a3}}) {
    ASSERT_TRUE(rig.window.Admit(0, r, &moved).ok());
    rig.window.Acquire(0, r, 0, rig.now, a->Callback(), &cbs);
  }
  RunAnswers(cbs);
  ASSERT_TRUE(a2.got && a2.got->ok() && a3.got && a3.got->ok());
  // Rank 2's process is replaced while it holds step 0: its batch goes (to be
  // built again if asked for); rank 3's stays.
  rig.window.NewProcess(2, 0xB2, &cbs);
  EXPECT_TRUE(rig.batches.at({0, 2})->discarded_);
  EXPECT_FALSE(rig.batches.at({0, 3})->discarded_);
  EXPECT_EQ(rig.window.InUse(), "rank 3 holds step 0");
  // The new one asks for step 0 again: built anew and handed out.
  Answer again;
  ASSERT_TRUE(rig.window.Admit(0, 2, &moved).ok());
  rig.window.Acquire(0, 2, 0, rig.now, again.Callback(), &cbs);
  rig.Round(&cbs);
  rig.Built(0, 2, &cbs);
  RunAnswers(cbs);
  ASSERT_TRUE(again.got.has_value());
  EXPECT_TRUE(again.got->ok()) << again.got->status();
}

// ------------------------------------------------------------ leases
BatchWindowOptions LeaseOptions() {
  BatchWindowOptions o = Rig::Options();
  o.lease = absl::Seconds(10);
  o.job_id = "leases";
  o.default_acquire_timeout_ms = 3600000;
  return o;
}

TEST(BatchWindowLeaseTest, ARankThatDiesHoldingABatchIsGivenUpAfterItsLeaseAndTheOthersGoOn) {
  Rig rig(LeaseOptions());
  BatchWindow::Callbacks cbs;
  rig.BothHoldStepZero(7, &cbs);  // rank 2 dies holding step 0
  rig.window.Release(0, 3, &cbs);
  ASSERT_TRUE(rig.Take(1, 3, &cbs).ok());  // rank 3 holds step 1 for longer than the lease
  // Step 2 is beyond the steps built while rank 2 holds step 0.
  Answer next;
  rig.window.Acquire(2, 3, 0, rig.now, next.Callback(), &cbs);
  auto renew3 = [&] { EXPECT_TRUE(rig.Renew(3, {1}).empty()); };
  rig.Pass(absl::Seconds(9), &cbs, renew3);
  RunAnswers(cbs);
  EXPECT_FALSE(next.got.has_value());
  EXPECT_EQ(rig.window.InUse(), "rank 2 holds step 0");
  EXPECT_FALSE(rig.window.Gone(2));
  rig.Pass(absl::Seconds(3), &cbs, renew3);
  RunAnswers(cbs);
  EXPECT_TRUE(rig.window.Gone(2));
  EXPECT_FALSE(rig.window.Gone(3));
  EXPECT_TRUE(rig.batches.at({0, 2})->discarded_);
  EXPECT_TRUE(rig.batches.at({1, 2})->discarded_);   // built ahead for it: the memory goes
  EXPECT_FALSE(rig.batches.at({1, 3})->discarded_);  // held 12 s, renewed: kept
  EXPECT_EQ(rig.Expired(), 1);
  EXPECT_EQ(rig.Lapsed(), 1);
  ASSERT_TRUE(next.got.has_value());
  ASSERT_TRUE(next.got->ok()) << next.got->status();
  EXPECT_EQ((*next.got)->step(), 2u);
  // Rank 3 goes on alone; nothing is built for rank 2 any more.
  rig.window.Release(1, 3, &cbs);
  rig.window.Release(2, 3, &cbs);
  for (uint64_t step = 3; step < 7; ++step) {
    absl::StatusOr<v1::BatchDescriptor> b = rig.Take(step, 3, &cbs);
    ASSERT_TRUE(b.ok()) << step << ": " << b.status();
    rig.window.Release(step, 3, &cbs);
  }
  EXPECT_EQ(rig.window.base(), 7u);
  EXPECT_FALSE(rig.batches.count({4, 2}));
  EXPECT_EQ(rig.window.memory(), 0u);
}

TEST(BatchWindowLeaseTest, AHoldItsLiveProcessNoLongerRenewsIsFreedAndReportedLost) {
  Rig rig(LeaseOptions());
  BatchWindow::Callbacks cbs;
  rig.BothHoldStepZero(4, &cbs);
  // Rank 2's process renews, but no longer names step 0 (its release was lost).
  rig.Pass(absl::Seconds(12), &cbs, [&] {
    rig.Renew(2, {});
    EXPECT_TRUE(rig.Renew(3, {0}).empty());
  });
  EXPECT_FALSE(rig.window.Gone(2));
  EXPECT_TRUE(rig.batches.at({0, 2})->discarded_);
  EXPECT_FALSE(rig.batches.at({0, 3})->discarded_);
  EXPECT_EQ(rig.Expired(), 1);
  EXPECT_EQ(rig.Lapsed(), 0);
  EXPECT_EQ(rig.Renew(2, {0}), std::vector<uint64_t>{0});
  EXPECT_EQ(rig.Renew(3, {0, 9}), std::vector<uint64_t>{9});
  EXPECT_EQ(rig.window.InUse(), "rank 3 holds step 0");
}

TEST(BatchWindowLeaseTest, AWaitingRankThatDiesIsAnsweredAndAClientThatRenewsNothingKeepsItsHold) {
  Rig rig(LeaseOptions());
  BatchWindow::Callbacks cbs;
  rig.window.NewProcess(3, 0xA3, &cbs);
  rig.window.Heard(3, 0xA3, rig.now, false);  // a client without lease renewals
  rig.Hello(2, &cbs);
  rig.Staged(0, 1);
  ASSERT_TRUE(rig.Take(0, 3, &cbs).ok());
  ASSERT_TRUE(rig.Take(0, 2, &cbs).ok());
  rig.window.Release(0, 2, &cbs);
  Answer waits;  // step 1 has no plan yet: rank 2 waits for it, then dies
  rig.window.Acquire(1, 2, 0, rig.now, waits.Callback(), &cbs);
  rig.Pass(absl::Seconds(60), &cbs);
  RunAnswers(cbs);
  ASSERT_TRUE(waits.got.has_value());
  EXPECT_EQ(waits.got->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(waits.got->status().message().find("taken as gone"), std::string::npos)
      << waits.got->status();
  EXPECT_TRUE(rig.window.Gone(2));
  EXPECT_FALSE(rig.window.Gone(3));
  EXPECT_FALSE(rig.batches.at({0, 3})->discarded_);  // held as before: until released
  EXPECT_EQ(rig.window.InUse(), "rank 3 holds step 0");
  EXPECT_EQ(rig.Expired(), 0);
  EXPECT_EQ(rig.Lapsed(), 1);
  // Rank 2's process was only stopped: its next call is served.
  rig.Hello(2, &cbs);
  EXPECT_FALSE(rig.window.Gone(2));
  rig.Staged(1, 2);
  absl::StatusOr<v1::BatchDescriptor> again = rig.Take(1, 2, &cbs);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->step(), 1u);
}

TEST(BatchWindowLeaseTest, NothingMovesWhenEveryRankIsGoneNorForAStallOfTheDaemon) {
  Rig rig(LeaseOptions());
  BatchWindow::Callbacks cbs;
  rig.BothHoldStepZero(6, &cbs);
  // The daemon's scheduler stalls for three leases: no one could renew meanwhile.
  rig.now += absl::Seconds(30);
  rig.Round(&cbs);
  EXPECT_FALSE(rig.window.Gone(2));
  EXPECT_FALSE(rig.window.Gone(3));
  EXPECT_EQ(rig.Expired(), 0);
  for (uint32_t r : {2u, 3u}) rig.window.Release(0, r, &cbs);
  EXPECT_EQ(rig.window.base(), 1u);
  rig.Pass(absl::Seconds(12), &cbs);  // both die
  EXPECT_TRUE(rig.window.Gone(2));
  EXPECT_TRUE(rig.window.Gone(3));
  EXPECT_EQ(rig.window.base(), 1u);  // nothing moves for no one
  EXPECT_EQ(rig.Lapsed(), 2);
  // The job restarts from its checkpoint at step 1: both are served.
  for (uint32_t r : {2u, 3u}) {
    rig.window.NewProcess(r, 0xB0 + r, &cbs);
    rig.window.Heard(r, 0xB0 + r, rig.now, true);
    absl::StatusOr<v1::BatchDescriptor> b = rig.Take(1, r, &cbs);
    ASSERT_TRUE(b.ok()) << b.status();
  }
}

}  // namespace
}  // namespace tutti::stager
