// tutti end to end, as a user runs it: `tutti gen-dataset`, `tutti index`,
// one tutti-packerd, two tutti-stagerd ("nodes" with their own caches) and 4
// ranks under mpirun (tutti-e2e-ranks, see e2e_ranks.cc) that pull every step
// of a one-epoch job and check every sample, image, token and exchanged byte
// against the packer's plan; then the step past the end is refused and every
// daemon stops cleanly on SIGTERM.
#include <signal.h>

#include <filesystem>
#include <map>
#include <optional>
#include <thread>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "common/grpc_status.h"
#include "gtest/gtest.h"
#include "tests/e2e_client.h"
#include "tests/e2e_support.h"
#include "tutti/v1/packer.grpc.pb.h"

namespace tutti::e2e {
namespace {

// The "key=value" fields of the line starting with `prefix`.
std::map<std::string, uint64_t> Fields(const std::string& output, const std::string& prefix) {
  std::map<std::string, uint64_t> out;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (!absl::ConsumePrefix(&line, prefix)) continue;
    for (absl::string_view kv : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
      uint64_t v = 0;
      if (absl::SimpleAtoi(p.second, &v)) out[p.first] = v;
    }
  }
  return out;
}

TEST(EndToEnd, FourRanksOnTwoNodesGetEveryPlannedSampleExactlyOnce) {
  const std::string dir = MakeTempDir("e2e");
  ASSERT_TRUE(GenerateDataset(dir + "/ds").ok());
  ASSERT_TRUE(BuildIndex(dir + "/ds", dir + "/index.tutti").ok());
  auto cluster = Cluster::Start({.dir = dir,
                                 .job_config = JobConfigText(dir + "/index.tutti", /*epochs=*/1),
                                 .source = dir + "/ds"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  v1::JobInfo job;
  {
    grpc::ClientContext ctx;
    auto stub = v1::Packer::NewStub(MakeChannel((*cluster)->packer().address()));
    ASSERT_TRUE(stub->GetJob(&ctx, v1::GetJobRequest(), &job).ok());
  }
  ASSERT_GE(job.total_steps(), 4u) << "the dataset is too small for a meaningful run";

  RunResult r = RunCommand(MpirunArgv(4, {E2eRanks(), "--stager=" + (*cluster)->StagerList(),
                                          "--packer=" + (*cluster)->packer().address(),
                                          "--expect_end", "--timeout_s=60"}),
                           absl::Seconds(150), MpiEnv());
  ASSERT_EQ(r.status, 0) << r.output;
  auto ok = Fields(r.output, "E2E OK ");
  ASSERT_FALSE(ok.empty()) << r.output;
  EXPECT_EQ(ok["steps"], job.total_steps());
  EXPECT_EQ(ok["docs"], job.total_steps() * 12);  // 8 text + 4 VL per step
  EXPECT_GT(ok["images"], job.total_steps() * 4 - 1);
  EXPECT_GT(ok["patches"], 0u);
  // Post-balancing moves encoder outputs between ranks (and nodes).
  EXPECT_GT(ok["cross_rank_bytes"], 0u) << r.output;
  EXPECT_NE(r.output.find(absl::StrCat("step ", job.total_steps())), std::string::npos) << r.output;

  // The stagers built every batch without skipping anything; both staged shards.
  for (int node = 0; node < 2; ++node) {
    auto m = HttpGet((*cluster)->stager(node).metrics_port(), "/metrics");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_GE(MetricValue(*m, "tutti_stager_batches_built_total").value_or(0),
              2.0 * job.total_steps());
    EXPECT_GT(MetricValue(*m, "tutti_stager_staged_files_total").value_or(0), 0);
    for (const char* reason : {"corrupt", "deadline", "missing", "too_large"}) {
      EXPECT_EQ(MetricValue(*m, absl::StrCat("tutti_stager_skipped_samples_total{reason=\"", reason,
                                             "\"}")),
                0.0)
          << reason;
    }
  }
  auto pm = HttpGet((*cluster)->packer().metrics_port(), "/metrics");
  ASSERT_TRUE(pm.ok()) << pm.status();
  EXPECT_GE(MetricValue(*pm, "tutti_packer_plans_served_total{rpc=\"GetPlan\"}").value_or(0),
            static_cast<double>(job.total_steps()));

  absl::Status stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
  RemoveTree(dir);
}

// The quick-start's rank program, as the quick-start runs it (post-balancing,
// every exchanged byte verified), over the same daemons.
TEST(EndToEnd, RankDemoRunsStepsAndPrintsOneRowPerRankAndStep) {
  const std::string dir = MakeTempDir("e2e_demo");
  ASSERT_TRUE(GenerateDataset(dir + "/ds").ok());
  ASSERT_TRUE(BuildIndex(dir + "/ds", dir + "/index.tutti").ok());
  auto cluster = Cluster::Start({.dir = dir,
                                 .job_config = JobConfigText(dir + "/index.tutti", /*epochs=*/0),
                                 .source = dir + "/ds"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  RunResult r = RunCommand(MpirunArgv(4, {RankDemo(), "--stager=" + (*cluster)->StagerList(),
                                          "--packer=" + (*cluster)->packer().address(), "--steps=8",
                                          "--batch_timeout_s=60", "--join_timeout_s=60"}),
                           absl::Seconds(150), MpiEnv());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("8 steps x 4 ranks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("every byte verified"), std::string::npos) << r.output;
  // One row per (step, rank), in step then rank order.
  std::vector<std::pair<int, int>> rows;
  for (absl::string_view line : absl::StrSplit(r.output, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int step = 0, rank = 0;
    if (f.size() == 11 && absl::SimpleAtoi(f[0], &step) && absl::SimpleAtoi(f[1], &rank)) {
      rows.emplace_back(step, rank);
    }
  }
  ASSERT_EQ(rows.size(), 32u) << r.output;
  for (int i = 0; i < 32; ++i) EXPECT_EQ(rows[i], std::make_pair(i / 4, i % 4));
  // The stagers asked the packer only for the plans they hold (the window of
  // 4 steps and stage_ahead 16 by default, beyond the 8 steps consumed), and
  // the packer planned at most its plan_window (4) past the furthest step
  // asked for: an endless job is not planned thousands of steps ahead. (The
  // packer drops plans more than plan_window behind that step, so a stager
  // that starts after the other re-plans what it asks for first: at most
  // one stager's worth of steps again.)
  auto pm = HttpGet((*cluster)->packer().metrics_port(), "/metrics");
  ASSERT_TRUE(pm.ok()) << pm.status();
  const double asked = 8 + 4 + 16;
  EXPECT_LE(MetricValue(*pm, "tutti_packer_client_step").value_or(1e9), asked) << *pm;
  EXPECT_LE(MetricValue(*pm, "tutti_packer_steps_planned_total").value_or(1e9), 2 * asked + 4) << *pm;
  absl::Status stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
  RemoveTree(dir);
}

// What each rank's batches hold, step by step: "step/rank: sample ids".
std::map<std::pair<uint64_t, int>, std::string> PullSteps(Cluster& cluster, uint64_t first,
                                                          uint64_t count) {
  std::map<std::pair<uint64_t, int>, std::string> out;
  std::vector<std::unique_ptr<Client>> clients;
  for (int rank = 0; rank < 4; ++rank) {
    auto c = Client::Connect(RankOptions(cluster.stager(rank / 2).address(),
                                         cluster.packer().address(), rank, 4,
                                         static_cast<int64_t>(first)));
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return out;
    clients.push_back(std::move(*c));
  }
  for (uint64_t i = 0; i < count; ++i) {
    for (int rank = 0; rank < 4; ++rank) {
      auto batch = clients[rank]->Next();
      EXPECT_TRUE(batch.ok()) << "rank " << rank << ", step " << first + i << ": "
                              << batch.status();
      if (!batch.ok()) return out;
      EXPECT_EQ(batch->step(), first + i);
      std::vector<uint64_t> ids;
      for (const auto& s : batch->samples()) ids.push_back(s.sample_id());
      out[{batch->step(), rank}] = absl::StrJoin(ids, ",");
      EXPECT_TRUE(batch->Release().ok());
    }
  }
  return out;
}

// A job resumed from a checkpoint at step K, on a restarted packer and
// fresh stagers (empty caches): the ranks start at K without waiting for
// earlier steps and get the batches an uninterrupted run got there.
TEST(EndToEnd, AJobResumedAtAStepGetsTheSameBatchesFromFreshDaemons) {
  const std::string dir = MakeTempDir("e2e_resume");
  ASSERT_TRUE(GenerateDataset(dir + "/ds").ok());
  ASSERT_TRUE(BuildIndex(dir + "/ds", dir + "/index.tutti").ok());
  const std::string config = JobConfigText(dir + "/index.tutti", /*epochs=*/1);
  std::map<std::pair<uint64_t, int>, std::string> first_run;
  for (const char* run : {"/run1", "/run2"}) std::filesystem::create_directories(dir + run);
  {
    auto cluster = Cluster::Start({.dir = dir + "/run1", .job_config = config, .source = dir + "/ds"});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    first_run = PullSteps(**cluster, 0, 6);
    EXPECT_TRUE((*cluster)->Stop().ok());
  }
  ASSERT_EQ(first_run.size(), 24u);
  auto cluster = Cluster::Start({.dir = dir + "/run2", .job_config = config, .source = dir + "/ds"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const absl::Time t0 = absl::Now();
  auto resumed = PullSteps(**cluster, 3, 3);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(60));
  ASSERT_EQ(resumed.size(), 12u);
  for (const auto& [key, ids] : resumed) {
    EXPECT_EQ(ids, first_run[key]) << "step " << key.first << ", rank " << key.second;
    EXPECT_FALSE(ids.empty());
  }
  EXPECT_TRUE((*cluster)->Stop().ok());
  RemoveTree(dir);
}

// tutti-stagerd killed with SIGKILL mid-run (a node's daemon crashing), then
// restarted by its supervisor on the same address and cache: the ranks'
// next Next() rides out the restart (UNAVAILABLE is retried) and they get
// the batches an undisturbed stager serves.
TEST(EndToEnd, RanksCarryOnAcrossAStagerKilledAndRestarted) {
  const std::string dir = MakeTempDir("e2e_stager_kill");
  ASSERT_TRUE(GenerateDataset(dir + "/ds").ok());
  ASSERT_TRUE(BuildIndex(dir + "/ds", dir + "/index.tutti").ok());
  auto cluster = Cluster::Start({.dir = dir,
                                 .job_config = JobConfigText(dir + "/index.tutti", /*epochs=*/1),
                                 .source = dir + "/ds"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string packer = (*cluster)->packer().address();
  const std::string address = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
  const std::vector<std::string> argv = {Stagerd(),
                                         "--packer=" + packer,
                                         "--node=0",
                                         "--source=" + dir + "/ds",
                                         "--cache=" + dir + "/cache-crash",
                                         "--listen=" + address,
                                         "--metrics=127.0.0.1:0",
                                         "--decode_threads=1"};
  auto connect = [&](const std::string& stager, int rank) {
    ClientOptions o = RankOptions(stager, packer, rank, 4);
    o.batch_timeout = absl::Seconds(60);
    return Client::Connect(o);
  };
  auto ids_of = [](Batch& b) {
    std::vector<uint64_t> ids;
    for (const auto& s : b.samples()) ids.push_back(s.sample_id());
    return absl::StrJoin(ids, ",");
  };
  // What node 0's undisturbed stager hands ranks 0 and 1 for steps 0..3.
  std::map<std::pair<uint64_t, int>, std::string> want;
  {
    auto r0 = connect((*cluster)->stager(0).address(), 0);
    auto r1 = connect((*cluster)->stager(0).address(), 1);
    ASSERT_TRUE(r0.ok() && r1.ok());
    for (uint64_t step = 0; step < 4; ++step) {
      for (auto* c : {r0->get(), r1->get()}) {
        auto b = c->Next();
        ASSERT_TRUE(b.ok()) << b.status();
        want[{step, c->rank()}] = ids_of(*b);
      }
    }
  }
  auto first = Daemon::Start("stager-crash", argv, dir);
  ASSERT_TRUE(first.ok()) << first.status();
  auto r0 = connect(address, 0);
  auto r1 = connect(address, 1);
  ASSERT_TRUE(r0.ok() && r1.ok()) << r0.status() << r1.status();
  std::optional<Batch> held;  // rank 0 holds step 1 across the crash
  for (uint64_t step = 0; step < 2; ++step) {
    for (auto* c : {r0->get(), r1->get()}) {
      auto b = c->Next();
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(ids_of(*b), (want[{step, c->rank()}])) << "step " << step;
      if (step == 1 && c->rank() == 0) held = std::move(*b);
    }
  }
  const std::vector<int32_t> held_ids(held->input_ids().begin(), held->input_ids().end());
  (*first)->process().Signal(SIGKILL);
  ASSERT_TRUE((*first)->process().Wait(absl::Seconds(10)).has_value());
  // The supervisor restarts it a moment later; the ranks are already asking.
  std::unique_ptr<Daemon> second;
  std::thread restart([&] {
    absl::SleepFor(absl::Milliseconds(500));
    auto d = Daemon::Start("stager-crash-2", argv, dir);
    EXPECT_TRUE(d.ok()) << d.status();
    if (d.ok()) second = std::move(*d);
  });
  for (uint64_t step = 2; step < 4; ++step) {
    for (auto* c : {r0->get(), r1->get()}) {
      auto b = c->Next();
      ASSERT_TRUE(b.ok()) << "step " << step << ", rank " << c->rank() << ": " << b.status();
      EXPECT_EQ(b->step(), step);
      EXPECT_EQ(ids_of(*b), (want[{step, c->rank()}])) << "step " << step;
    }
  }
  restart.join();
  ASSERT_NE(second, nullptr);
  // The held batch's memory outlived its daemon; releasing it to the new one is fine.
  EXPECT_TRUE(std::equal(held_ids.begin(), held_ids.end(), held->input_ids().begin()));
  EXPECT_EQ(ids_of(*held), (want[{1, 0}]));
  EXPECT_TRUE(held->Release().ok());
  EXPECT_TRUE(second->Stop().ok()) << second->log();
  EXPECT_TRUE((*cluster)->Stop().ok());
  RemoveTree(dir);
}

}  // namespace
}  // namespace tutti::e2e
