// Ranks that come and go, as real processes: tutti-packerd and one
// tutti-stagerd (node 0, ranks 0 and 1) serve tutti-test-lease-rank
// processes (lease_rank.cc, libtutti) that are killed with SIGKILL while
// they hold a batch. The stager is never restarted:
// - both ranks die holding step 3 and the job restarts from its checkpoint
//   at step 2; then rank 0 alone dies holding step 3 and restarts at step 4:
//   both carry on past where the window used to stall;
// - a rank dies holding a batch and never comes back: the other carries on
//   once the dead rank's lease lapses, while a slow but live rank that holds
//   a batch for three leases keeps it;
// - ranks come back to a fresh stager at steps a few apart, in either order
//   (a stager restarted under a running job): all are served.
#include <signal.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/e2e_support.h"

namespace tutti::e2e {
namespace {

class RankLeases : public ::testing::Test {
 protected:
  void StartCluster(const std::string& name, std::vector<std::string> stager_flags,
                    int epochs = 4) {
    dir_ = MakeTempDir(name);
    ASSERT_TRUE(GenerateDataset(dir_ + "/ds").ok());
    ASSERT_TRUE(BuildIndex(dir_ + "/ds", dir_ + "/index.tutti").ok());
    stager_flags.push_back("--decode_threads=1");
    auto cluster = Cluster::Start({.dir = dir_,
                                   .job_config = JobConfigText(dir_ + "/index.tutti", epochs),
                                   .source = dir_ + "/ds",
                                   .nodes = 1,
                                   .stager_flags = stager_flags});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }
  void TearDown() override {
    ranks_.clear();  // kills what still runs
    if (cluster_) {
      EXPECT_TRUE(cluster_->Stop().ok());
    }
    if (!dir_.empty() && !HasFailure()) RemoveTree(dir_);
  }

  // A rank process; `flags` are tutti-test-lease-rank's.
  Process* Rank(int rank, const std::string& tag, std::vector<std::string> flags) {
    std::vector<std::string> argv = {TUTTI_LEASE_RANK, "--stager=" + cluster_->stager(0).address(),
                                     "--packer=" + cluster_->packer().address(),
                                     absl::StrCat("--rank=", rank)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto p = Process::Start(argv, absl::StrCat(dir_, "/rank", rank, "-", tag, ".log"));
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return nullptr;
    ranks_.push_back(std::move(*p));
    return ranks_.back().get();
  }
  // Waits (generously: the machine may be loaded) until `p` printed `line`.
  static bool Says(Process* p, const std::string& line,
                   absl::Duration timeout = absl::Seconds(180)) {
    for (const absl::Time end = absl::Now() + timeout; absl::Now() < end;) {
      if (absl::StrContains(p->log(), line)) return true;
      if (!p->Running() && !absl::StrContains(p->log(), line)) return false;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }
  static void Kill(Process* p) {
    p->Signal(SIGKILL);
    EXPECT_EQ(p->Wait(absl::Seconds(30)), -SIGKILL);
  }
  static void ExpectDone(Process* p, int rank) {
    const std::optional<int> status = p->Wait(absl::Seconds(240));
    EXPECT_EQ(status, 0) << Tail(p->log());
    EXPECT_TRUE(absl::StrContains(p->log(), absl::StrCat("rank ", rank, " done")))
        << Tail(p->log());
  }
  double StagerMetric(const std::string& name) {
    absl::StatusOr<std::string> page = HttpGet(cluster_->stager(0).metrics_port(), "/metrics");
    EXPECT_TRUE(page.ok()) << page.status();
    return page.ok() ? MetricValue(*page, name).value_or(-1) : -1;
  }

  std::string dir_;
  std::unique_ptr<Cluster> cluster_;
  std::vector<std::unique_ptr<Process>> ranks_;
};

TEST_F(RankLeases, KilledRanksResumeFromACheckpointOrAloneOnTheSameStager) {
  StartCluster("rank_kill_resume", {});  // the default lease (60 s): the incarnations do it
  // Both ranks die holding step 3.
  Process* a0 = Rank(0, "a", {"--start_step=0", "--end_step=14", "--hold_step=3"});
  Process* a1 = Rank(1, "a", {"--start_step=0", "--end_step=14", "--hold_step=3"});
  ASSERT_TRUE(a0 && a1);
  ASSERT_TRUE(Says(a0, "rank 0 holding step 3")) << Tail(a0->log());
  ASSERT_TRUE(Says(a1, "rank 1 holding step 3")) << Tail(a1->log());
  Kill(a0);
  Kill(a1);
  // The job restarts from its checkpoint at step 2. Rank 0 dies again
  // holding step 3 while rank 1 goes on to the end of the window.
  const absl::Time restarted = absl::Now();
  Process* b0 = Rank(0, "b", {"--start_step=2", "--end_step=14", "--hold_step=3"});
  Process* b1 = Rank(1, "b", {"--start_step=2", "--end_step=14"});
  ASSERT_TRUE(b0 && b1);
  ASSERT_TRUE(Says(b0, "rank 0 step 2 ok")) << Tail(b0->log());
  ASSERT_TRUE(Says(b1, "rank 1 step 2 ok")) << Tail(b1->log());
  ASSERT_TRUE(Says(b0, "rank 0 holding step 3")) << Tail(b0->log());
  ASSERT_TRUE(Says(b1, "rank 1 step 6 ok")) << Tail(b1->log());
  Kill(b0);
  // Rank 0 restarts alone at step 4: both go on to the end.
  Process* c0 = Rank(0, "c", {"--start_step=4", "--end_step=14"});
  ASSERT_TRUE(c0);
  ExpectDone(c0, 0);
  ExpectDone(b1, 1);
  EXPECT_TRUE(absl::StrContains(b1->log(), "rank 1 step 13 ok")) << Tail(b1->log());
  std::printf("resumed and finished 12 steps in %s after the restart\n",
              absl::FormatDuration(absl::Now() - restarted).c_str());
  // New processes reclaimed what the dead ones held: no lease had to lapse.
  EXPECT_EQ(StagerMetric("tutti_stager_leases_expired_total"), 0)
      << Tail(cluster_->stager(0).log(), 40);
}

TEST_F(RankLeases, ADeadRankIsGivenUpAfterItsLeaseAndASlowLiveOneKeepsItsBatch) {
  constexpr int kLeaseSeconds = 5;
  StartCluster("rank_leases", {absl::StrCat("--lease_seconds=", kLeaseSeconds)});
  // Rank 0 holds step 1 for three leases; rank 1 dies holding step 3 and
  // never comes back.
  Process* r0 = Rank(0, "slow",
                     {"--start_step=0", "--end_step=14", "--slow_step=1",
                      absl::StrCat("--slow_seconds=", 3 * kLeaseSeconds)});
  Process* r1 = Rank(1, "dies", {"--start_step=0", "--end_step=14", "--hold_step=3"});
  ASSERT_TRUE(r0 && r1);
  ASSERT_TRUE(Says(r1, "rank 1 holding step 3")) << Tail(r1->log());
  Kill(r1);
  const absl::Time killed = absl::Now();
  ExpectDone(r0, 0);
  EXPECT_TRUE(absl::StrContains(r0->log(), "rank 0 held step 1 for 15 s: still held"))
      << Tail(r0->log());
  EXPECT_TRUE(absl::StrContains(r0->log(), "rank 0 step 13 ok")) << Tail(r0->log());
  const absl::Duration after = absl::Now() - killed;
  std::printf("rank 0 finished %s after rank 1 was killed (lease %d s)\n",
              absl::FormatDuration(after).c_str(), kLeaseSeconds);
  // Only the dead rank's batch was freed, once, and its rank given up.
  EXPECT_EQ(StagerMetric("tutti_stager_leases_expired_total"), 1);
  EXPECT_EQ(StagerMetric("tutti_stager_ranks_lapsed_total"), 1);
  const std::string log = cluster_->stager(0).log();
  int named = 0, rank0 = 0;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (!absl::StrContains(line, "the lease of a batch lapsed")) continue;
    named += absl::StrContains(line, " rank=1 ") && absl::StrContains(line, " step=3 ") &&
             absl::StrContains(line, " job=");
    rank0 += absl::StrContains(line, " rank=0 ");
  }
  EXPECT_EQ(named, 1) << Tail(log, 40);
  EXPECT_EQ(rank0, 0) << Tail(log, 40);
}

// On a fresh stager (the window at step 0), rank 0 asks for step `a` and,
// a second later, rank 1 for step `b`: ranks coming back after the stager
// restarted under a running job, each keeping its batch until it has the
// next. Both run on to the same step.
TEST_F(RankLeases, RanksComingBackAtDifferentStepsAreAllServedInEitherOrder) {
  StartCluster("rank_skew", {}, /*epochs=*/0);  // open-ended: any step exists
  int n = 0;
  // The window is 4 steps (--window): ranks up to 3 apart, in either order.
  for (auto [a, b] : {std::pair<int64_t, int64_t>{20, 19}, {40, 41}, {60, 57}, {80, 83}}) {
    SCOPED_TRACE(absl::StrCat("rank 0 at step ", a, ", then rank 1 at step ", b));
    const int64_t end = std::max(a, b) + 6;
    auto flags = [&](int64_t start) {
      return std::vector<std::string>{absl::StrCat("--start_step=", start),
                                      absl::StrCat("--end_step=", end), "--hold_previous",
                                      "--batch_timeout_s=60"};
    };
    const std::string tag = absl::StrCat("skew", n++);
    Process* r0 = Rank(0, tag, flags(a));
    ASSERT_TRUE(r0 && Says(r0, "rank 0 connected")) << (r0 ? Tail(r0->log()) : "");
    absl::SleepFor(absl::Seconds(1));
    Process* r1 = Rank(1, tag, flags(b));
    ASSERT_TRUE(r1);
    ExpectDone(r0, 0);
    ExpectDone(r1, 1);
    EXPECT_TRUE(absl::StrContains(r1->log(), absl::StrCat("rank 1 step ", end - 1, " ok")))
        << Tail(r1->log());
  }
}

}  // namespace
}  // namespace tutti::e2e
