// A home node that dies, end to end: one tutti-packerd with locality and a
// --locality_record, four tutti-stagerd as four nodes reporting themselves
// (--node_report_interval_ms), 8 ranks as libtutti clients. After two steps
// node 3's stager is SIGKILLed and not restarted: the packer counts it dead
// (--node_dead_after_s), announces its removal from the first step it has
// not planned, and the plans from there on name no home and no holder on
// node 3; the other nodes' ranks get every planned sample of every step
// exactly once, nothing skipped (the steps in flight read what node 3 held
// from the source). Then a packer restarted with the same record plans
// every step byte for byte as before.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "common/grpc_status.h"
#include "gtest/gtest.h"
#include "tests/e2e_client.h"
#include "tests/e2e_support.h"
#include "tutti/v1/packer.grpc.pb.h"

namespace tutti::e2e {
namespace {

constexpr int kNodes = 4, kRanks = 8, kDeadNode = 3;

double Metric(int port, const std::string& name) {
  auto page = HttpGet(port, "/metrics");
  if (!page.ok()) return -1;
  return MetricValue(*page, name).value_or(-1);
}

// The whole plan of `step` (every rank) as the packer serializes it, less
// the time it took to plan.
std::string PlanBytes(const std::string& packer, uint64_t step, v1::StepPlan* out = nullptr) {
  auto stub = v1::Packer::NewStub(MakeChannel(packer));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::GetPlanRequest req;
  req.set_step(step);
  v1::StepPlan plan;
  const grpc::Status s = stub->GetPlan(&ctx, req, &plan);
  if (!s.ok()) return absl::StrCat("error: ", s.error_message());
  if (out != nullptr) *out = plan;
  plan.mutable_stats()->clear_plan_seconds();  // how long planning took: not the plan
  return plan.SerializeAsString();
}

// The documents of a rank's plan, by sample id.
std::multiset<uint64_t> Docs(const v1::RankPlan& plan) {
  std::multiset<uint64_t> out;
  for (const v1::MicroBatch& mb : plan.micro_batches()) {
    for (const v1::Sequence& seq : mb.sequences()) {
      for (const v1::DocSlot& d : seq.docs()) out.insert(d.sample_id());
    }
  }
  return out;
}

// The step the record says node `node` was removed from, or -1.
int64_t RemovalStep(const std::string& record, int node) {
  for (absl::string_view line : absl::StrSplit(record, '\n')) {
    std::vector<absl::string_view> w = absl::StrSplit(line, ' ');
    int n = -1;
    int64_t step = -1;
    if (w.size() == 3 && w[0] == "remove" && absl::SimpleAtoi(w[1], &n) && n == node &&
        absl::SimpleAtoi(w[2], &step)) {
      return step;
    }
  }
  return -1;
}

TEST(LocalityFaultsEndToEnd, AKilledStagerIsReHomedAndARestartedPackerPlansTheSame) {
  const std::string dir = MakeTempDir("locality-faults");
  ASSERT_TRUE(GenerateDataset(dir + "/ds", {"--samples=128", "--samples-per-shard=16"}).ok());
  ASSERT_TRUE(BuildIndex(dir + "/ds", dir + "/index.tutti").ok());
  // Four epochs: the stagers ask for plans well ahead, so the removal lands
  // steps after the kill.
  std::string config = JobConfigText(dir + "/index.tutti", /*epochs=*/4);
  config = absl::StrReplaceAll(config, {{"world_size: 4", "world_size: 8"}});
  absl::StrAppend(&config, "locality { home_replication: 1 }\nsample_deadline_ms: 30000\n");
  const std::string record = dir + "/locality.record";
  const std::vector<std::string> packer_flags = {"--locality_record=" + record,
                                                 "--node_dead_after_s=4"};
  auto cluster = Cluster::Start({.dir = dir,
                                 .job_config = config,
                                 .source = dir + "/ds",
                                 .nodes = kNodes,
                                 .stager_flags = {"--node_report_interval_ms=200"},
                                 .packer_flags = packer_flags,
                                 .peers = true});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  const std::string packer = c.packer().address();
  const int packer_metrics = c.packer().metrics_port();

  v1::JobInfo job;
  {
    grpc::ClientContext ctx;
    auto stub = v1::Packer::NewStub(MakeChannel(packer));
    ASSERT_TRUE(stub->GetJob(&ctx, v1::GetJobRequest(), &job).ok());
  }
  const uint64_t steps = job.total_steps();
  ASSERT_GE(steps, 8u);
  // Every node reports before anything is asked of it.
  bool all_live = false;
  for (int i = 0; i < 300 && !all_live; ++i) {
    all_live = Metric(packer_metrics, "tutti_packer_locality_nodes{state=\"live\"}") == kNodes;
    if (!all_live) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(all_live) << Tail(c.packer().log());

  std::vector<std::unique_ptr<Client>> clients;
  for (int rank = 0; rank < kRanks; ++rank) {
    auto client = Client::Connect(RankOptions(c.stager(rank / 2).address(), packer, rank, kRanks));
    ASSERT_TRUE(client.ok()) << client.status();
    clients.push_back(*std::move(client));
  }
  // Each rank's batch is the packer's plan for it, and within a step no
  // sample reaches two ranks; nothing skipped.
  std::map<uint64_t, std::string> plans;
  auto serve = [&](uint64_t step, int ranks) {
    v1::StepPlan plan;
    plans[step] = PlanBytes(packer, step, &plan);
    ASSERT_EQ(plan.ranks_size(), kRanks) << plans[step];
    std::multiset<uint64_t> seen;
    for (int rank = 0; rank < ranks; ++rank) {
      SCOPED_TRACE(absl::StrCat("step ", step, " rank ", rank));
      auto batch = clients[rank]->Next();
      ASSERT_TRUE(batch.ok()) << batch.status();
      ASSERT_EQ(batch->step(), step);
      EXPECT_EQ(batch->skipped().size(), 0);
      const std::multiset<uint64_t> docs = Docs(batch->plan());
      EXPECT_EQ(docs, Docs(plan.ranks(rank)));
      seen.insert(docs.begin(), docs.end());
      EXPECT_TRUE(batch->Release().ok());
    }
    for (uint64_t id : seen) EXPECT_EQ(seen.count(id), 1u) << "sample " << id << " step " << step;
  };
  for (uint64_t step = 0; step < 2; ++step) serve(step, kRanks);

  // Node 3's stager dies and stays dead.
  c.stager(kDeadNode).process().Signal(SIGKILL);
  c.stager(kDeadNode).process().Wait(absl::Seconds(10));
  clients.resize(2 * kDeadNode);
  int64_t from = -1;
  for (int i = 0; i < 300 && from < 0; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    from = RemovalStep(ReadFileOrEmpty(record), kDeadNode);
  }
  ASSERT_GE(from, 2) << ReadFileOrEmpty(record) << Tail(c.packer().log());
  // At least node 3: a live stager starved of CPU for the whole delay would
  // be removed too (and added back once it reports again). The record is
  // written before the change is counted, and the node gauges are set last.
  const std::string removed = "tutti_packer_locality_nodes{state=\"removed\"}";
  for (int i = 0; i < 100 && Metric(packer_metrics, removed) < 1; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_GE(Metric(packer_metrics, removed), 1);
  EXPECT_GE(Metric(packer_metrics, "tutti_packer_locality_rehomings_total{reason=\"dead\"}"), 1);
  EXPECT_LT(static_cast<uint64_t>(from), steps) << "the removal lands after the job's end";

  // Nodes 0..2 go on, through four steps planned after the removal.
  const uint64_t last = std::min<uint64_t>(steps, static_cast<uint64_t>(from) + 4);
  for (uint64_t step = 2; step < last; ++step) serve(step, 2 * kDeadNode);
  for (uint64_t step = static_cast<uint64_t>(from); step < last; ++step) {
    v1::StepPlan plan;
    PlanBytes(packer, step, &plan);
    for (const v1::ShardRef& ref : plan.shards()) {
      for (uint32_t n : ref.home_nodes()) EXPECT_NE(n, kDeadNode) << "step " << step;
    }
  }
  for (int node = 0; node < kDeadNode; ++node) {
    const int port = c.stager(node).metrics_port();
    for (const char* reason : {"corrupt", "deadline", "missing", "too_large", "checksum"}) {
      EXPECT_EQ(
          Metric(port, absl::StrCat("tutti_stager_skipped_samples_total{reason=\"", reason, "\"}")),
          0.0)
          << "node " << node << " " << reason;
    }
    EXPECT_GT(Metric(port, "tutti_stager_node_reports_total{result=\"sent\"}"), 0);
  }
  std::printf("node %d removed from step %lld of %llu; steps 0..%llu served and compared\n",
              kDeadNode, static_cast<long long>(from), static_cast<unsigned long long>(steps),
              static_cast<unsigned long long>(last - 1));
  clients.clear();
  for (int node = 0; node < kDeadNode; ++node) c.stager(node).RequestStop();
  for (int node = 0; node < kDeadNode; ++node) EXPECT_TRUE(c.stager(node).AwaitStop().ok());
  ASSERT_TRUE(c.packer().Stop().ok());

  // A packer restarted with the record: every step planned as before.
  std::vector<std::string> argv = {Packerd(), "--config=" + dir + "/job.textproto",
                                   "--listen=127.0.0.1:0", "--metrics=127.0.0.1:0"};
  argv.insert(argv.end(), packer_flags.begin(), packer_flags.end());
  auto again = Daemon::Start("packer-again", argv, dir);
  ASSERT_TRUE(again.ok()) << again.status();
  for (uint64_t step = last; step-- > 0;) {
    EXPECT_TRUE(PlanBytes((*again)->address(), step) == plans[step]) << "step " << step;
  }
  EXPECT_TRUE((*again)->Stop().ok());
  RemoveTree(dir);
}

}  // namespace
}  // namespace tutti::e2e
