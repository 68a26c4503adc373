// Bad input end to end, through the real daemons and libtutti: a missing or
// empty source directory, a corrupt image in a shard, a shard truncated after
// indexing, a port in use, a step past the end of a one-epoch job, a rank that
// never comes (its node's window stalls: the others' wait ends, saying why), a rank
// outside the world and a world size that does not match the job. Each must
// give a clear message naming the file or value and what to do, within a
// bounded time, and nothing may crash or hang. (Per-component cases live
// with the components: tests/packer_daemon_test.cc, stager_integration_test.cc,
// services/packer/index_builder_test.cc, client/client_options_test.cc.)
#include <google/protobuf/text_format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/tar.h"
#include "client/client.h"
#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e_client.h"
#include "tests/e2e_support.h"
#include "tutti/v1/packer.grpc.pb.h"
#include "tutti/v1/stager.grpc.pb.h"

namespace tutti::e2e {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// A dataset, its index and the job config, without daemons.
struct Dataset {
  std::string dir, source, index, job;
};

Dataset MakeDataset(const std::string& name, const std::vector<std::string>& gen_flags = {}) {
  Dataset d;
  d.dir = MakeTempDir(name);
  d.source = d.dir + "/ds";
  d.index = d.dir + "/index.tutti";
  d.job = d.dir + "/job.textproto";
  absl::Status s = GenerateDataset(d.source, gen_flags);
  EXPECT_TRUE(s.ok()) << s;
  s = BuildIndex(d.source, d.index);
  EXPECT_TRUE(s.ok()) << s;
  std::ofstream(d.job) << JobConfigText(d.index, /*epochs=*/1);
  return d;
}

// The packer's plan of `step`, from `tutti plan` (its planning core).
v1::StepPlan PlanOf(const Dataset& d, uint64_t step) {
  RunResult r = RunCommand(
      {TuttiCli(), "plan", "--config=" + d.job, absl::StrCat("--step=", step), "--format=text"},
      absl::Seconds(60));
  v1::StepPlan plan;
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(r.output, &plan)) << r.output;
  return plan;
}

// Overwrites `n` bytes of `path` at `offset`.
void Scribble(const std::string& path, uint64_t offset, size_t n) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  const std::string junk(n, '\x55');
  f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  ASSERT_TRUE(f.good()) << path;
}

absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& stager,
                                                const std::string& packer, int rank, int world,
                                                int64_t start_step = 0) {
  ClientOptions o = RankOptions(stager, packer, rank, world, start_step);
  o.connect_timeout = absl::Seconds(3);
  return Client::Connect(o);
}

// A one-epoch job served by a packer and two stagers.
class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = MakeDataset("bad_input");
    auto c = Cluster::Start(
        {.dir = data_.dir, .job_config = JobConfigText(data_.index, 1), .source = data_.source});
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    grpc::ClientContext ctx;
    auto stub = v1::Packer::NewStub(MakeChannel(packer()));
    ASSERT_TRUE(stub->GetJob(&ctx, v1::GetJobRequest(), &job_).ok());
  }
  void TearDown() override {
    if (cluster_ != nullptr) {
      absl::Status s = cluster_->Stop();
      EXPECT_TRUE(s.ok()) << s;
    }
    RemoveTree(data_.dir);
  }
  std::string packer() const { return cluster_->packer().address(); }
  std::string stager(int node) const { return cluster_->stager(node).address(); }

  Dataset data_;
  std::unique_ptr<Cluster> cluster_;
  v1::JobInfo job_;
};

TEST_F(BadInput, MissingSourceDirectoryIsNamedByTheStagerAndTheIndexer) {
  const std::string missing = data_.dir + "/no-such-dataset";
  RunResult r = RunCommand({Stagerd(), "--packer=" + packer(), "--node=0", "--source=" + missing,
                            "--cache=" + data_.dir + "/cache-x", "--listen=127.0.0.1:0",
                            "--metrics=127.0.0.1:0", "--packer_wait_s=5"},
                           absl::Seconds(30));
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(missing));
  EXPECT_THAT(r.output, HasSubstr("--source"));

  std::string out;
  absl::Status s = BuildIndex(missing, data_.dir + "/x.tutti", {}, &out);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(out, HasSubstr(missing));
  EXPECT_THAT(out, HasSubstr("--source"));
}

TEST_F(BadInput, SourceWithoutTheShardsIsRefusedAndMissingShardsAreSkippedNamingThem) {
  // The wrong directory (or an NFS path not mounted): refused at start.
  const std::string empty = data_.dir + "/empty-source";
  fs::create_directories(empty);
  RunResult r = RunCommand({Stagerd(), "--packer=" + packer(), "--node=0", "--source=" + empty,
                            "--cache=" + data_.dir + "/cache-empty", "--listen=127.0.0.1:0",
                            "--metrics=127.0.0.1:0", "--packer_wait_s=5"},
                           absl::Seconds(30));
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--source " + empty + " holds none of the job's shards"));

  // All shards but one gone: a warning at start, then their samples are
  // skipped as `missing`, naming the file and the fix; the batches ship.
  const std::string half = data_.dir + "/half-source";
  fs::create_directories(half);
  int kept = 0, shards = 0;
  for (const auto& e : fs::directory_iterator(data_.source)) {
    if (e.path().extension() != ".tar") continue;
    if (shards++ == 0) {
      fs::create_hard_link(e.path(), half + "/" + e.path().filename().string());
      ++kept;
    }
  }
  ASSERT_GE(shards, 2);
  auto d = Daemon::Start("stager-half",
                         {Stagerd(), "--packer=" + packer(), "--node=0", "--source=" + half,
                          "--cache=" + data_.dir + "/cache-half", "--listen=127.0.0.1:0",
                          "--metrics=127.0.0.1:0", "--decode_threads=1"},
                         data_.dir);
  ASSERT_TRUE(d.ok()) << d.status();
  auto client = Connect((*d)->address(), packer(), 0, 4);
  ASSERT_TRUE(client.ok()) << client.status();
  int skipped = 0;
  for (int step = 0; step < 4 && skipped == 0; ++step) {
    auto batch = (*client)->Next();
    ASSERT_TRUE(batch.ok()) << batch.status();
    for (const v1::SkippedSample& s : batch->skipped()) {
      ++skipped;
      EXPECT_EQ(s.reason(), "missing") << s.DebugString();
      EXPECT_THAT(s.detail(), HasSubstr(half + "/shard-"));
      EXPECT_THAT(s.detail(), HasSubstr("fix --source"));
    }
    EXPECT_TRUE(batch->Release().ok());
  }
  EXPECT_GT(skipped, 0) << kept << " of " << shards << " shards kept";
  EXPECT_TRUE((*d)->Stop().ok()) << (*d)->log();
  EXPECT_THAT((*d)->log(), HasSubstr("missing from --source " + half));
}

TEST(DaemonHelp, HelpExitsZeroAndListsTheDaemonsOwnFlags) {
  for (const auto& [binary, flag] : {std::pair<std::string, std::string>{Packerd(), "--config"},
                                     {Stagerd(), "--cache_capacity"}}) {
    RunResult r = RunCommand({binary, "--help"}, absl::Seconds(30));
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("usage: "));
    EXPECT_THAT(r.output, HasSubstr(flag));
    EXPECT_THAT(r.output, HasSubstr("--metrics"));
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr("main.cc")));     // no source paths
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr("--flagfile")));  // no Abseil internals
  }
}

TEST_F(BadInput, PortInUseIsRefusedNamingTheAddress) {
  const std::string taken = packer();
  RunResult r = RunCommand(
      {Stagerd(), "--packer=" + packer(), "--node=0", "--source=" + data_.source,
       "--cache=" + data_.dir + "/cache-port", "--listen=" + taken, "--metrics=127.0.0.1:0"},
      absl::Seconds(30));
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(taken));
  EXPECT_THAT(r.output, HasSubstr("in use"));

  const std::string metrics = absl::StrCat("127.0.0.1:", cluster_->stager(0).metrics_port());
  r = RunCommand(
      {Stagerd(), "--packer=" + packer(), "--node=0", "--source=" + data_.source,
       "--cache=" + data_.dir + "/cache-port2", "--listen=127.0.0.1:0", "--metrics=" + metrics},
      absl::Seconds(30));
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(metrics));

  r = RunCommand(
      {Packerd(), "--config=" + data_.job, "--listen=127.0.0.1:0", "--metrics=" + metrics},
      absl::Seconds(30));
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(metrics));
}

TEST_F(BadInput, StepPastTheEndIsOutOfRangeForClientsAndRanks) {
  const uint64_t end = job_.total_steps();
  ASSERT_GT(end, 0u);
  for (uint64_t step : {end, end + 5}) {
    auto client = Connect(stager(0), packer(), 1, 4, static_cast<int64_t>(step));
    ASSERT_TRUE(client.ok()) << client.status();
    const absl::Time t0 = absl::Now();
    auto batch = (*client)->Next();
    EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
    ASSERT_EQ(batch.status().code(), absl::StatusCode::kOutOfRange) << batch.status();
    EXPECT_THAT(Message(batch.status()), HasSubstr(absl::StrCat("step ", step)));
    EXPECT_THAT(Message(batch.status()), HasSubstr(absl::StrCat("end (", end, " steps)")));
  }
  // Ranks asked for more steps than the job has stop together at its end,
  // with the summary of the steps there were, and exit 0.
  RunResult r = RunCommand(MpirunArgv(4, {RankDemo(), "--stager=" + cluster_->StagerList(),
                                          "--packer=" + packer(), absl::StrCat("--steps=", end + 1),
                                          "--batch_timeout_s=30", "--join_timeout_s=30"}),
                           absl::Seconds(120), MpiEnv());
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat("step ", end, " is past the job's end")));
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat("stopping after ", end, " of the ", end + 1)));
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat(end, " steps x 4 ranks: mean wait")));

  // `tutti plan` asked past the end prints the steps there are and says where it ends.
  RunResult p = RunCommand({TuttiCli(), "plan", "--config=" + data_.job,
                            absl::StrCat("--step=", end - 1), "--steps=3", "--format=hash"},
                           absl::Seconds(60));
  EXPECT_EQ(p.status, 0) << p.output;
  EXPECT_THAT(p.output, HasSubstr(absl::StrCat("step ", end - 1, " ")));
  EXPECT_THAT(p.output, HasSubstr(absl::StrCat("the job ends after step ", end - 1, " (", end,
                                               " steps); planned 1 of the 3 steps")));
}

// Rank 1 never shows up: node 0's window cannot move past step 0, so rank
// 0's wait for step 4 (window 4) ends at its batch timeout, saying why.
TEST_F(BadInput, ARankThatNeverComesHoldsTheWindowAndTheWaitSaysWhy) {
  ClientOptions o = RankOptions(stager(0), packer(), 0, 4);
  o.connect_timeout = absl::Seconds(5);
  o.batch_timeout = absl::Seconds(3);
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  for (int step = 0; step < 4; ++step) {
    auto batch = (*client)->Next();
    ASSERT_TRUE(batch.ok()) << batch.status();
  }
  const absl::Time t0 = absl::Now();
  auto stuck = (*client)->Next();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(15));
  EXPECT_EQ(stuck.status().code(), absl::StatusCode::kDeadlineExceeded) << stuck.status();
  EXPECT_THAT(Message(stuck.status()), HasSubstr("step 4, rank 0"));
  EXPECT_THAT(Message(stuck.status()), HasSubstr("beyond the steps being built (0..3)"));
  EXPECT_THAT(Message(stuck.status()), HasSubstr("rank 1 has not asked for step 0"));
}

TEST_F(BadInput, RankOutsideTheWorldIsRefused) {
  auto c = Connect(stager(1), packer(), 4, 4);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_THAT(Message(c.status()), HasSubstr("rank 4 is outside world size 4"));

  c = Connect(stager(1), packer(), 6, -1);  // world size unknown: the job's is used
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
  EXPECT_THAT(Message(c.status()), HasSubstr("rank 6"));
  EXPECT_THAT(Message(c.status()), HasSubstr("4 ranks"));

  // A stager serves only its node's ranks.
  auto stub = v1::Stager::NewStub(MakeChannel(stager(0)));
  for (uint32_t rank : {2u, 9u}) {
    grpc::ClientContext ctx;
    v1::AcquireBatchRequest req;
    req.set_step(0);
    req.set_rank(rank);
    req.set_timeout_ms(2000);
    v1::BatchDescriptor d;
    grpc::Status s = stub->AcquireBatch(&ctx, req, &d);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("rank ", rank)));
    EXPECT_THAT(s.error_message(), HasSubstr("0..1"));
  }

  // Nothing listening where the client looks for the packer.
  const std::string nobody = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
  const absl::Time t0 = absl::Now();
  c = Connect(stager(0), nobody, 0, 4);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(15));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_THAT(Message(c.status()), HasSubstr(nobody));
  EXPECT_THAT(Message(c.status()), HasSubstr("is tutti-packerd running there?"));
}

TEST_F(BadInput, MismatchedWorldSizeIsRefusedOnEveryRank) {
  auto c = Connect(stager(0), packer(), 0, 2);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
  EXPECT_THAT(Message(c.status()), HasSubstr("world size mismatch"));
  EXPECT_THAT(Message(c.status()), HasSubstr("launch 4 ranks"));

  RunResult r =
      RunCommand(MpirunArgv(2, {RankDemo(), "--stager=" + cluster_->StagerList(),
                                "--packer=" + packer(), "--steps=2", "--connect_timeout_s=10"}),
                 absl::Seconds(90), MpiEnv());
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("this client runs with 2 ranks"));
  EXPECT_THAT(r.output, HasSubstr("planned for 4 ranks"));

  // One stager address per node: 3 addresses cannot split 4 ranks.
  r = RunCommand(MpirunArgv(4, {RankDemo(), "--stager=" + cluster_->StagerList() + "," + stager(0),
                                "--packer=" + packer(), "--steps=2"}),
                 absl::Seconds(90), MpiEnv());
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("lists 3 stagers (one per node) but the job has 4 ranks"));
}

// A PNG whose compressed data is damaged (its header is intact, so the index
// takes it): the stager replaces the sample, names the member, and the batch
// keeps its planned shape.
TEST(BadInputData, CorruptImageIsReplacedAndNamed) {
  Dataset d = MakeDataset("corrupt_image", {"--formats=png"});
  const v1::StepPlan plan = PlanOf(d, 0);
  std::map<uint64_t, const v1::SampleInfo*> samples;
  for (const auto& s : plan.samples()) samples[s.sample_id()] = &s;
  const v1::ImagePlan* target = nullptr;
  uint32_t rank = 0;
  for (const auto& rp : plan.ranks()) {
    for (const auto& enc : rp.encoders()) {
      if (target == nullptr && enc.images_size() > 0) target = &enc.images(0), rank = rp.rank();
    }
  }
  ASSERT_NE(target, nullptr) << "step 0 has no image";
  const v1::SampleInfo& sample = *samples.at(target->sample_id());
  const v1::MemberRef& member = sample.images(target->image_index());
  const std::string shard = d.source + "/" + plan.shards(sample.shard()).name();
  Scribble(shard, member.offset() + member.size() / 2, 256);
  ASSERT_TRUE(BuildIndex(d.source, d.index).ok());  // headers intact: still indexed

  auto cluster =
      Cluster::Start({.dir = d.dir, .job_config = JobConfigText(d.index, 1), .source = d.source});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Connect((*cluster)->stager(rank / 2).address(), (*cluster)->packer().address(),
                        static_cast<int>(rank), 4);
  ASSERT_TRUE(client.ok()) << client.status();
  auto batch = (*client)->Next();
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->skipped().size(), 1) << batch->descriptor().DebugString();
  const v1::SkippedSample& skipped = batch->skipped()[0];
  EXPECT_EQ(skipped.sample_id(), target->sample_id());
  EXPECT_EQ(skipped.reason(), "corrupt");
  EXPECT_THAT(skipped.detail(), HasSubstr(member.name()));
  EXPECT_EQ(skipped.substitute_id(), 0u);  // no other sample's image stands in
  EXPECT_EQ(skipped.action(), "placeholder");
  uint64_t rows = 0;
  for (const auto& enc : batch->plan().encoders()) {
    for (const auto& ip : enc.images()) rows += ip.patches();
  }
  EXPECT_EQ(batch->patches(), rows);  // a placeholder: shapes as planned
  EXPECT_TRUE(batch->Release().ok());
  auto m = HttpGet((*cluster)->stager(rank / 2).metrics_port(), "/metrics");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GE(MetricValue(*m, "tutti_stager_skipped_samples_total{reason=\"corrupt\"}").value_or(0),
            1);
  absl::Status s = (*cluster)->Stop();
  EXPECT_TRUE(s.ok()) << s;
  RemoveTree(d.dir);
}

// A shard cut short after it was indexed: staging it fails its check, and
// the samples it can no longer supply are replaced and named, with the fix.
TEST(BadInputData, ShardTruncatedAfterIndexingIsReportedPerSample) {
  Dataset d = MakeDataset("truncated");
  const v1::StepPlan plan = PlanOf(d, 0);
  uint64_t victim = UINT64_MAX;  // rank 0's first document
  for (const auto& mb : plan.ranks(0).micro_batches()) {
    for (const auto& seq : mb.sequences()) {
      if (victim == UINT64_MAX && seq.docs_size() > 0) victim = seq.docs(0).sample_id();
    }
  }
  ASSERT_NE(victim, UINT64_MAX) << "rank 0 has no document at step 0";
  const v1::SampleInfo* sample = nullptr;
  for (const auto& s : plan.samples()) {
    if (s.sample_id() == victim) sample = &s;
  }
  ASSERT_NE(sample, nullptr);
  const std::string shard = d.source + "/" + plan.shards(sample->shard()).name();
  fs::resize_file(shard, sample->text().offset());  // its text member's data is gone

  auto cluster =
      Cluster::Start({.dir = d.dir, .job_config = JobConfigText(d.index, 1), .source = d.source});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Connect((*cluster)->stager(0).address(), (*cluster)->packer().address(), 0, 4);
  ASSERT_TRUE(client.ok()) << client.status();
  auto batch = (*client)->Next();
  ASSERT_TRUE(batch.ok()) << batch.status();
  const v1::SkippedSample* found = nullptr;
  for (const auto& s : batch->skipped()) {
    if (s.sample_id() == victim) found = &s;
  }
  ASSERT_NE(found, nullptr) << batch->descriptor().DebugString();
  EXPECT_THAT(found->detail(), HasSubstr(shard));
  EXPECT_THAT(found->detail(), HasSubstr("truncated"));
  EXPECT_THAT(found->detail(), HasSubstr("re-copy or re-index"));
  EXPECT_TRUE(batch->Release().ok());
  // Staging the shard failed its size/checksum check (counted, not fatal).
  double failures = 0;
  for (absl::Time give_up = absl::Now() + absl::Seconds(20); absl::Now() < give_up;) {
    auto m = HttpGet((*cluster)->stager(0).metrics_port(), "/metrics");
    ASSERT_TRUE(m.ok()) << m.status();
    failures = MetricValue(*m, "tutti_stager_staging_failures_total").value_or(0);
    if (failures > 0) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_GE(failures, 1);
  absl::Status s = (*cluster)->Stop();
  EXPECT_TRUE(s.ok()) << s;
  RemoveTree(d.dir);
}

// `tutti index` over only bad shards: a tar whose GNU base-256 size is
// 2^64 - 512 (its checksum valid; the offset arithmetic used to wrap and loop
// forever) and a 0-byte shard. It must end promptly, print every shard's
// reason, and fail; given a good shard it writes into a directory it creates.
TEST(BadInputData, IndexOfOnlyBadShardsEndsAndSaysWhyForEach) {
  const std::string dir = MakeTempDir("index_bad");
  TarWriter w;
  w.Add("a.json", "{\"input_ids\": [1, 2]}");
  std::string tar = w.Finish();
  char* h = tar.data();
  std::memset(h + 124, 0, 12);
  h[124] = static_cast<char>(0x80);
  for (int i = 4; i < 10; ++i) h[124 + i] = static_cast<char>(0xFF);
  h[124 + 10] = static_cast<char>(0xFE);
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; ++i) sum += static_cast<unsigned char>(h[i]);
  std::snprintf(h + 148, 8, "%06o", sum);
  fs::create_directories(dir + "/src");
  std::ofstream(dir + "/src/wrap.tar", std::ios::binary) << tar;
  std::ofstream(dir + "/src/empty.tar", std::ios::binary);
  std::string out;
  absl::Status s = BuildIndex(dir + "/src", dir + "/new/sub/index.tutti", {}, &out);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(out, HasSubstr("wrap.tar: truncated tar"));
  EXPECT_THAT(out, HasSubstr("empty.tar: empty file (0 bytes)"));
  EXPECT_THAT(out, HasSubstr("no usable sample"));

  TarWriter good;
  good.Add("b.json", "{\"input_ids\": [1, 2]}");
  std::ofstream(dir + "/src/good.tar", std::ios::binary) << good.Finish();
  s = BuildIndex(dir + "/src", dir + "/new/sub/index.tutti", {}, &out);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(fs::exists(dir + "/new/sub/index.tutti")) << out;
  EXPECT_THAT(out, HasSubstr("left out 2 bad shards"));
  RemoveTree(dir);
}

}  // namespace
}  // namespace tutti::e2e
