// `tutti plan --locality-record --node-removals`: the plans a tutti-packerd
// served after node changes (a node removed by its locality record, another
// by --node_removals) reproduced offline, every step byte for byte (equal
// plan hashes), the steps before a change as without it; a record of
// another job, a job without locality, a record that is not there and a
// malformed removal list refused naming what is wrong. `tutti simulate`
// takes the same flags.
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/packer/core/home_staging.h"
#include "services/packer/load_job.h"
#include "services/packer/locality_record.h"
#include "services/packer/plan_proto.h"
#include "tests/e2e_support.h"
#include "tutti/v1/packer.grpc.pb.h"

namespace tutti::e2e {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kSteps = 6;
constexpr uint32_t kRecordedNode = 3, kOperatorNode = 1;
constexpr uint64_t kRecordedFrom = 2, kOperatorFrom = 4;

// "step N HASH" lines of `tutti plan --format hash`, by step.
std::map<uint64_t, std::string> Hashes(const std::string& output) {
  std::map<uint64_t, std::string> out;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    std::vector<std::string> w = absl::StrSplit(line, ' ');
    if (w.size() == 3 && w[0] == "step") out[std::stoull(w[1])] = w[2];
  }
  return out;
}

// The plan the daemon at `address` serves for `step`, or an error status.
absl::StatusOr<v1::StepPlan> Served(const std::string& address, uint64_t step) {
  auto stub = v1::Packer::NewStub(MakeChannel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::GetPlanRequest req;
  req.set_step(step);
  v1::StepPlan plan;
  const grpc::Status s = stub->GetPlan(&ctx, req, &plan);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  return plan;
}

TEST(PlanLocalityRecord, ReplaysTheNodeChangesTheDaemonPlannedWith) {
  const std::string dir = MakeTempDir("plan_locality_record");
  ASSERT_TRUE(GenerateDataset(dir + "/ds", {"--samples=128", "--samples-per-shard=16"}).ok());
  ASSERT_TRUE(BuildIndex(dir + "/ds", dir + "/index.tutti").ok());
  // Eight ranks on four nodes, one home per shard.
  std::string text = JobConfigText(dir + "/index.tutti", /*epochs=*/4);
  text = absl::StrReplaceAll(text, {{"world_size: 4", "world_size: 8"}});
  const std::string plain_config = dir + "/plain.textproto";
  std::ofstream(plain_config) << text;
  absl::StrAppend(&text, "locality { home_replication: 1 }\n");
  const std::string config = dir + "/job.textproto";
  std::ofstream(config) << text;
  const std::string removals = absl::StrCat(kOperatorNode, "@", kOperatorFrom);
  packer::JobOptions options;
  auto parsed = packer::ParseNodeRemovals(removals);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  options.node_removals = *parsed;
  auto job = packer::LoadJob(config, "", options);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_GE((*job)->total_steps(), kSteps);

  // The record as a packer leaves it after removing a dead node 3 from
  // step 2 (steps 0 and 1 planned before).
  packer::LocalityChange dead;
  dead.kind = packer::LocalityChange::Kind::kRemove;
  dead.node = kRecordedNode;
  dead.from_step = kRecordedFrom;
  const std::string record = dir + "/locality.record";
  std::ofstream(record) << packer::FormatLocalityRecord(
      {(*job)->fingerprint(), kRecordedFrom, {dead}});

  // The daemon restarted with that record and the operator's removal of
  // node 1 from step 4: the plans it serves.
  auto daemon = Daemon::Start(
      "packer",
      {Packerd(), "--config=" + config, "--listen=127.0.0.1:0", "--metrics=127.0.0.1:0",
       "--locality_record=" + record, "--node_removals=" + removals},
      dir);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  std::map<uint64_t, std::string> served;
  for (uint64_t s = 0; s < kSteps; ++s) {
    auto plan = Served((*daemon)->address(), s);
    ASSERT_TRUE(plan.ok()) << "step " << s << ": " << plan.status();
    for (const v1::ShardRef& ref : plan->shards()) {
      for (uint32_t n : ref.home_nodes()) {
        if (s >= kRecordedFrom) EXPECT_NE(n, kRecordedNode) << "step " << s;
        if (s >= kOperatorFrom) EXPECT_NE(n, kOperatorNode) << "step " << s;
      }
    }
    served[s] = packer::PlanHash(&*plan);
  }
  ASSERT_TRUE((*daemon)->Stop().ok());

  // Offline, from the record the daemon left (its reservation moved on).
  const std::vector<std::string> plan = {TuttiCli(), "plan", "--step=0",
                                         absl::StrCat("--steps=", kSteps), "--format=hash"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> argv = plan;
    argv.insert(argv.end(), more.begin(), more.end());
    return RunCommand(argv, absl::Seconds(60));
  };
  RunResult replayed =
      with({"--config=" + config, "--locality-record=" + record, "--node-removals=" + removals});
  ASSERT_EQ(replayed.status, 0) << replayed.output;
  RunResult homes_only = with({"--config=" + config});
  ASSERT_EQ(homes_only.status, 0) << homes_only.output;
  const auto replayed_hash = Hashes(replayed.output), plain_hash = Hashes(homes_only.output);
  ASSERT_EQ(replayed_hash.size(), kSteps) << replayed.output;
  ASSERT_EQ(plain_hash.size(), kSteps) << homes_only.output;
  for (uint64_t s = 0; s < kSteps; ++s) {
    EXPECT_EQ(replayed_hash.at(s), served.at(s)) << "step " << s;
    if (s < kRecordedFrom) {
      EXPECT_EQ(replayed_hash.at(s), plain_hash.at(s)) << "before the changes, step " << s;
    } else {
      EXPECT_NE(replayed_hash.at(s), plain_hash.at(s)) << "after a change, step " << s;
    }
  }
  // Without the operator's list the steps from its removal differ.
  RunResult record_only = with({"--config=" + config, "--locality-record=" + record});
  ASSERT_EQ(record_only.status, 0) << record_only.output;
  const auto record_hash = Hashes(record_only.output);
  ASSERT_EQ(record_hash.size(), kSteps) << record_only.output;
  EXPECT_EQ(record_hash.at(kOperatorFrom - 1), served.at(kOperatorFrom - 1));
  EXPECT_NE(record_hash.at(kOperatorFrom), served.at(kOperatorFrom));

  // `tutti simulate` plans the job the same way: with the record its steps
  // after the changes load more from other nodes than with the job's homes.
  const std::vector<std::string> simulate = {TuttiCli(), "simulate", "--config=" + config,
                                             absl::StrCat("--steps=", kSteps)};
  auto loaded = [](const std::string& output) {
    for (absl::string_view line : absl::StrSplit(output, '\n')) {
      if (absl::StrContains(line, "loaded from other nodes")) return std::string(line);
    }
    return std::string("none in: ") + output;
  };
  RunResult sim_plain = RunCommand(simulate, absl::Seconds(60));
  ASSERT_EQ(sim_plain.status, 0) << sim_plain.output;
  std::vector<std::string> argv = simulate;
  argv.push_back("--locality-record=" + record);
  argv.push_back("--node-removals=" + removals);
  RunResult sim_replayed = RunCommand(argv, absl::Seconds(60));
  ASSERT_EQ(sim_replayed.status, 0) << sim_replayed.output;
  EXPECT_THAT(loaded(sim_plain.output), HasSubstr("exchange per step"));
  EXPECT_THAT(loaded(sim_replayed.output), HasSubstr("exchange per step"));
  EXPECT_NE(loaded(sim_plain.output), loaded(sim_replayed.output));
  argv.back() = "--node-removals=9@1";
  RunResult sim_bad = RunCommand(argv, absl::Seconds(60));
  EXPECT_EQ(sim_bad.status, 1) << sim_bad.output;
  sim_bad = RunCommand({TuttiCli(), "simulate", "--egress", "--locality-record=" + record},
                       absl::Seconds(60));
  EXPECT_EQ(sim_bad.status, 2) << sim_bad.output;
  EXPECT_THAT(sim_bad.output, HasSubstr("--locality-record"));

  // Another job's record, a job without locality, no file, a bad list,
  // --check.
  std::ofstream(dir + "/other.record")
      << packer::FormatLocalityRecord({"0123456789abcdef", kRecordedFrom, {dead}});
  RunResult r = with({"--config=" + config, "--locality-record=" + dir + "/other.record"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("0123456789abcdef"));
  r = with({"--config=" + plain_config, "--locality-record=" + record});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("has no locality"));
  r = with({"--config=" + config, "--locality-record=" + dir + "/none.record"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("none.record cannot be read"));
  r = with({"--config=" + config, "--node-removals=three@2"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--node-removals"));
  r = RunCommand(
      {TuttiCli(), "plan", "--config=" + config, "--check", "--locality-record=" + record},
      absl::Seconds(60));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--locality-record"));
  RemoveTree(dir);
}

}  // namespace
}  // namespace tutti::e2e
