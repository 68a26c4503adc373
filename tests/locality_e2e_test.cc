// Cluster-scale staging end to end, as a user runs it: `tutti gen-dataset`,
// `tutti index`, one tutti-packerd with the job's locality on (every shard
// one home node), four tutti-stagerd as four nodes (each listening on its
// own port, all of them named in --peers) and 8 ranks under mpirun
// (tutti-e2e-ranks: every sample, image, token and exchanged byte checked
// against the packer's plan, each planned sample served exactly once), with
// post-balancing on and off. Each shard is read from the source only by its
// home node's stager, once: every stager stages its homes ahead (also those
// only other nodes' ranks read, StepPlan.held_shards) and nothing else, and
// the members the others need reach them stager to stager, none from the
// source. The source bytes summed over the stagers are the dataset's.
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/grpc_status.h"
#include "common/shard_homes.h"
#include "gtest/gtest.h"
#include "tests/e2e_support.h"
#include "tutti/v1/packer.grpc.pb.h"
#include "tutti/v1/stager.grpc.pb.h"

namespace tutti::e2e {
namespace {

constexpr int kNodes = 4;

double Metric(int port, const std::string& name) {
  auto page = HttpGet(port, "/metrics");
  if (!page.ok()) return -1;
  return MetricValue(*page, name).value_or(-1);
}

void RunLocality(bool post_balancing) {
  const std::string dir = MakeTempDir(post_balancing ? "locality-pb" : "locality-nopb");
  ASSERT_TRUE(GenerateDataset(dir + "/ds", {"--samples=128", "--samples-per-shard=16"}).ok());
  ASSERT_TRUE(BuildIndex(dir + "/ds", dir + "/index.tutti").ok());
  std::string config = JobConfigText(dir + "/index.tutti", /*epochs=*/1);
  config = absl::StrReplaceAll(config, {{"world_size: 4", "world_size: 8"}});
  if (!post_balancing) {
    config = absl::StrReplaceAll(
        config, {{"post_balancing { enabled: true", "post_balancing { enabled: false"}});
  }
  // A deadline a loaded host keeps: a holder that answers late would send
  // its members through the source (counted as fallbacks below).
  absl::StrAppend(&config, "locality { home_replication: 1 }\nsample_deadline_ms: 30000\n");
  // --node=auto: a stager fetches and builds nothing before its first rank
  // calls, so none asks a holder that is still starting (which would answer
  // UNAVAILABLE and send the member through the source; correct, but not
  // what this test counts).
  auto cluster = Cluster::Start({.dir = dir,
                                 .job_config = config,
                                 .source = dir + "/ds",
                                 .nodes = kNodes,
                                 .stager_flags = {"--node=auto"},
                                 .peers = true});
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  v1::JobInfo job;
  {
    grpc::ClientContext ctx;
    auto stub = v1::Packer::NewStub(MakeChannel((*cluster)->packer().address()));
    ASSERT_TRUE(stub->GetJob(&ctx, v1::GetJobRequest(), &job).ok());
  }
  ASSERT_GE(job.total_steps(), 4u);
  ASSERT_GE(job.shards_size(), kNodes);

  RunResult r = RunCommand(MpirunArgv(8, {E2eRanks(), "--stager=" + (*cluster)->StagerList(),
                                          "--packer=" + (*cluster)->packer().address(),
                                          "--expect_end", "--timeout_s=90"}),
                           absl::Seconds(280), MpiEnv());
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_NE(r.output.find("E2E OK "), std::string::npos) << r.output;

  // The homes the packer assigned (common/shard_homes.h: the job's seed and
  // the shards' names; no capacity bound).
  std::vector<ShardKey> keys;
  for (const std::string& name : job.shards()) keys.push_back({name, 0});
  ShardHomesOptions ho;
  ho.seed = job.config().seed();
  auto homes = ShardHomes::Assign(keys, kNodes, ho);
  ASSERT_TRUE(homes.ok()) << homes.status();
  std::map<std::string, uint32_t> home;
  for (int i = 0; i < job.shards_size(); ++i) home[job.shards(i)] = homes->Homes(i)[0];
  // The bytes of each node's home shards, and of the dataset.
  std::map<uint32_t, double> home_bytes;
  double dataset_bytes = 0;
  for (const auto& [name, node] : home) {
    const double size = static_cast<double>(std::filesystem::file_size(dir + "/ds/" + name));
    home_bytes[node] += size;
    dataset_bytes += size;
  }

  double received = 0, sent = 0, source = 0;
  for (int node = 0; node < kNodes; ++node) {
    SCOPED_TRACE(absl::StrCat("node ", node));
    const int port = (*cluster)->stager(node).metrics_port();
    for (const char* reason : {"corrupt", "deadline", "missing", "too_large", "checksum"}) {
      EXPECT_EQ(
          Metric(port, absl::StrCat("tutti_stager_skipped_samples_total{reason=\"", reason, "\"}")),
          0.0)
          << reason;
    }
    EXPECT_EQ(Metric(port, "tutti_stager_peer_members_total{outcome=\"fallback\"}"), 0.0);
    std::printf("node %d: source_bytes=%.0f staged_bytes=%.0f peer_sent=%.0f peer_received=%.0f\n",
                node, Metric(port, "tutti_stager_source_bytes_total"),
                Metric(port, "tutti_stager_staged_bytes_total"),
                Metric(port, "tutti_stager_peer_bytes_total{direction=\"sent\"}"),
                Metric(port, "tutti_stager_peer_bytes_total{direction=\"received\"}"));
    received += Metric(port, "tutti_stager_peer_bytes_total{direction=\"received\"}");
    // Its home shards, each copied once, and nothing else from the source.
    const double from_source = Metric(port, "tutti_stager_source_bytes_total");
    EXPECT_EQ(from_source, home_bytes[node]);
    EXPECT_EQ(from_source, Metric(port, "tutti_stager_staged_bytes_total"));
    source += from_source;
    sent += Metric(port, "tutti_stager_peer_bytes_total{direction=\"sent\"}");
    // Only its home shards were staged (so read from the source) here.
    grpc::ClientContext ctx;
    v1::StageStatus status;
    auto stub = v1::Stager::NewStub(MakeChannel((*cluster)->stager(node).address()));
    ASSERT_TRUE(stub->GetStageStatus(&ctx, v1::GetStageStatusRequest(), &status).ok());
    for (const v1::ShardStatus& s : status.shards()) {
      if (s.state() == v1::ShardStatus::STATE_STAGED ||
          s.state() == v1::ShardStatus::STATE_STAGING) {
        EXPECT_EQ(home.at(s.name()), static_cast<uint32_t>(node)) << s.name();
      }
    }
  }
  // Four nodes, every global batch random: some inputs were placed away
  // from their shard's home and moved stager to stager.
  EXPECT_GT(received, 0);
  EXPECT_EQ(sent, received);
  std::printf(
      "source bytes over the stagers %.0f = %.3f x the dataset (%.0f bytes); "
      "stager to stager %.0f bytes\n",
      source, source / dataset_bytes, dataset_bytes, received);
  EXPECT_EQ(source, dataset_bytes);

  absl::Status stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
  RemoveTree(dir);
}

TEST(LocalityEndToEnd, EightRanksOnFourNodesWithPostBalancing) { RunLocality(true); }

TEST(LocalityEndToEnd, EightRanksOnFourNodesWithoutPostBalancing) { RunLocality(false); }

}  // namespace
}  // namespace tutti::e2e
