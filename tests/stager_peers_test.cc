// Stager to stager: FetchMembers (the holder's side) and the receiving side
// of remote_load items, with real tutti-stagerd servers (StagerServer, in
// process) on loopback against a small tutti.v1.Packer fixture serving
// precomputed plans: the request's bounds and the job's token, member bytes
// as stored in the shard, and two stagers as two nodes fetching each
// other's members (then the source when the holder fails or is late).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"
#include "common/http_client.h"
#include "common/rpc_security.h"
#include "common/shard_homes.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "services/stager/member_stream.h"
#include "services/stager/peer_fetcher.h"
#include "services/stager/stager_server.h"
#include "services/stager/test_dataset.h"
#include "tutti/v1/packer.grpc.pb.h"
#include "tutti/v1/stager.grpc.pb.h"

namespace tutti::stager {
namespace {

namespace fs = std::filesystem;

// GetJob, and StreamPlans of testing::MakePlan passed through `edit` (which
// marks items remote_load and names their holder).
class FixturePacker final : public v1::Packer::Service {
 public:
  using Edit = std::function<void(v1::StepPlan*)>;
  FixturePacker(testing::Dataset data, v1::JobInfo job, uint64_t end_step, Edit edit = {})
      : data_(std::move(data)), job_(std::move(job)), end_(end_step), edit_(std::move(edit)) {}
  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest*,
                      v1::JobInfo* out) override {
    while (hold_job_ && !job_released_.WaitForNotificationWithTimeout(absl::Milliseconds(5))) {
      if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
    }
    *out = job_;
    return grpc::Status::OK;
  }
  grpc::Status StreamPlans(grpc::ServerContext* ctx, const v1::StreamPlansRequest* req,
                           grpc::ServerWriter<v1::StepPlan>* w) override {
    while (!open_.WaitForNotificationWithTimeout(absl::Milliseconds(5))) {
      if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
    }
    std::vector<uint32_t> ranks(req->ranks().begin(), req->ranks().end());
    const uint64_t stop = req->end_step() == 0 ? ~uint64_t{0} : req->end_step();
    for (uint64_t s = req->start_step(); s < stop && !ctx->IsCancelled(); ++s) {
      if (s >= end_) {
        return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                            "step " + std::to_string(s) + " is past the end of the dataset");
      }
      if (!w->Write(Plan(s, ranks))) break;
    }
    return grpc::Status::OK;
  }
  // Plans flow once every stager has started (a real cluster's stagers start
  // at different times: a holder not serving yet, or starting past the peer
  // timeout, has its members read from the source, which would make the
  // counts below vary).
  void Open() {
    if (!open_.HasBeenNotified()) open_.Notify();
  }
  // GetJob answers only once ReleaseJob is called (a stager stays starting).
  void HoldJob() { hold_job_ = true; }
  void ReleaseJob() {
    if (!job_released_.HasBeenNotified()) job_released_.Notify();
  }
  v1::StepPlan Plan(uint64_t step, const std::vector<uint32_t>& ranks) const {
    v1::StepPlan plan = testing::MakePlan(data_, job_, step, ranks, 2);
    if (edit_) edit_(&plan);
    return plan;
  }

 private:
  testing::Dataset data_;
  v1::JobInfo job_;
  uint64_t end_;
  Edit edit_;
  absl::Notification open_;
  std::atomic<bool> hold_job_{false};
  absl::Notification job_released_;
};

struct Env {
  std::string root;
  testing::Dataset data;
  v1::JobInfo job;
  std::unique_ptr<FixturePacker> packer;
  std::unique_ptr<GrpcServer> packer_server;
  int packer_port = 0;

  Env(const std::string& name, int shards, uint32_t world, uint32_t ranks_per_node) {
    root = ::testing::TempDir() + "/peers_" + name + "_" + std::to_string(::getpid());
    fs::remove_all(root);
    data = testing::WriteDataset(root + "/src", {.shards = shards, .samples_per_shard = 8});
    job = testing::MakeJob(data, world, ranks_per_node);
    job.mutable_config()->set_job_id("peers-" + name);
  }
  // Plans flow once Open() is called (at once unless `gated`).
  void StartPacker(uint64_t end_step, FixturePacker::Edit edit = {}, bool gated = false) {
    packer = std::make_unique<FixturePacker>(data, job, end_step, std::move(edit));
    if (!gated) packer->Open();
    auto s = StartGrpcServer("127.0.0.1:0", {packer.get()}, &packer_port);
    ASSERT_TRUE(s.ok()) << s.status();
    packer_server = std::move(*s);
  }
  StagerServerOptions Options(uint32_t node) {
    StagerServerOptions o;
    o.packer = "127.0.0.1:" + std::to_string(packer_port);
    o.listen = "127.0.0.1:0";
    o.metrics = "127.0.0.1:0";
    o.packer_wait = absl::Seconds(20);
    o.core.node = node;
    o.core.cache_dir = absl::StrCat(root, "/cache", node);
    o.core.staging.source_dir = data.dir;
    o.core.staging.queue_depth = 8;
    o.core.staging.block_size = 65536;
    o.core.decode_threads = 2;
    o.core.window = 2;
    o.core.stage_ahead = 2;
    return o;
  }
  ~Env() { fs::remove_all(root); }
};

// The bytes of `member` as stored in the shard.
std::string MemberBytes(const testing::Dataset& data, const v1::ShardRef& shard,
                        const v1::MemberRef& member) {
  std::ifstream in(data.dir + "/" + shard.name(), std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return all.substr(member.offset(), member.size());
}

// FetchMembers for `req` with `security`'s token: the stream's messages by
// index, and how it ended.
struct Fetched {
  grpc::Status status;
  std::map<uint32_t, v1::FetchedMember> members;
};
Fetched Fetch(int port, const v1::FetchMembersRequest& req, const SecurityOptions& security) {
  auto stub = v1::Stager::NewStub(MakeSecureChannel("127.0.0.1:" + std::to_string(port), security));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto reader = stub->FetchMembers(&ctx, req);
  Fetched out;
  v1::FetchedMember m;
  while (reader->Read(&m)) out.members[m.index()] = m;
  out.status = reader->Finish();
  return out;
}

double Metric(int port, const std::string& name) {
  absl::StatusOr<std::string> page = HttpGet(port, "/metrics");
  if (!page.ok()) return -1;
  return MetricValue(*page, name).value_or(-1);
}

// A request for the first `n` members (image, text) of shard 0's samples.
v1::FetchMembersRequest FirstMembers(const testing::Dataset& data, int n) {
  v1::FetchMembersRequest req;
  *req.mutable_shard() = data.shards[0];
  for (const v1::SampleInfo& s : data.samples) {
    if (s.shard() != 0) continue;
    if (req.members_size() < n) *req.add_members() = s.images(0);
    if (req.members_size() < n) *req.add_members() = s.text();
  }
  return req;
}

// The shards a stager staged.
std::set<std::string> Staged(StagerServer& server) {
  std::set<std::string> out;
  const v1::StageStatus status = server.core()->GetStageStatus();
  for (const v1::ShardStatus& s : status.shards()) {
    if (s.state() == v1::ShardStatus::STATE_STAGED) out.insert(s.name());
  }
  return out;
}

TEST(PeersFlagTest, NodeAddressPairsAreParsedAndMistakesNamed) {
  auto peers = ParsePeers("0=10.0.0.1:7071, 3=node3:7071");
  ASSERT_TRUE(peers.ok()) << peers.status();
  EXPECT_EQ(*peers, (std::map<uint32_t, std::string>{{0, "10.0.0.1:7071"}, {3, "node3:7071"}}));
  EXPECT_TRUE(ParsePeers("")->empty());
  for (const char* bad : {"10.0.0.1:7071", "x=10.0.0.1:7071", "1=", "-1=a:1"}) {
    auto r = ParsePeers(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("NODE=HOST:PORT"), std::string::npos) << r.status();
  }
  auto twice = ParsePeers("1=a:1,1=b:2");
  EXPECT_NE(twice.status().message().find("names node 1 twice"), std::string::npos)
      << twice.status();
}

TEST(FetchMembersTest, ACallWithoutTheJobsTokenIsRefused) {
  Env env("token", 2, 2, 1);
  env.StartPacker(4);
  StagerServerOptions o = env.Options(0);
  o.rpc.security.token = "the-job-token";
  StagerServer server(o);
  ASSERT_TRUE(server.Start().ok());
  const v1::FetchMembersRequest req = FirstMembers(env.data, 2);

  Fetched none = Fetch(server.grpc_port(), req, {});
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << none.status.error_message();
  EXPECT_TRUE(none.members.empty());
  SecurityOptions wrong;
  wrong.token = "another-job";
  EXPECT_EQ(Fetch(server.grpc_port(), req, wrong).status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Metric(server.metrics_port(), "tutti_stager_peer_bytes_total{direction=\"sent\"}"), 0);

  SecurityOptions right;
  right.token = "the-job-token";
  Fetched ok = Fetch(server.grpc_port(), req, right);
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  ASSERT_EQ(ok.members.size(), 2u);
  for (uint32_t i = 0; i < 2; ++i) {
    EXPECT_EQ(ok.members[i].code(), 0) << ok.members[i].error();
    EXPECT_EQ(ok.members[i].data(),
              MemberBytes(env.data, req.shard(), req.members(static_cast<int>(i))));
  }
}

// A stager whose --listen is a Unix socket (its ranks' address) serves other
// nodes' stagers on --peer_listen: FetchMembers there with the job's token,
// health, and every rank's call refused there (the same rank is served on
// the socket).
TEST(PeerListenTest, AUnixSocketStagerServesPeersThereAndRefusesRanks) {
  Env env("peer_listen", 2, 2, 1);
  env.StartPacker(4);
  StagerServerOptions o = env.Options(0);
  const std::string socket = absl::StrCat("unix://", env.root, "/s0.sock");
  o.listen = socket;
  o.peer_listen = "127.0.0.1:0";
  o.port_file = env.root + "/s0.ports";
  o.rpc.security.token = "the-job-token";
  StagerServer server(o);
  ASSERT_TRUE(server.Start().ok());
  const int port = server.peer_port();
  ASSERT_GT(port, 0);
  EXPECT_EQ(server.grpc_port(), 0);
  std::ifstream ports(o.port_file);
  const std::string port_file((std::istreambuf_iterator<char>(ports)),
                              std::istreambuf_iterator<char>());
  EXPECT_NE(port_file.find(absl::StrCat("\npeer_grpc=", port, "\n")), std::string::npos)
      << port_file;

  const v1::FetchMembersRequest req = FirstMembers(env.data, 2);
  SecurityOptions token;
  token.token = "the-job-token";
  Fetched ok = Fetch(port, req, token);
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  ASSERT_EQ(ok.members.size(), 2u);
  for (uint32_t i = 0; i < 2; ++i) {
    EXPECT_EQ(ok.members[i].data(),
              MemberBytes(env.data, req.shard(), req.members(static_cast<int>(i))));
  }
  EXPECT_EQ(Fetch(port, req, {}).status.error_code(), grpc::StatusCode::UNAUTHENTICATED);

  auto health =
      grpc::health::v1::Health::NewStub(MakeSecureChannel(absl::StrCat("127.0.0.1:", port), token));
  grpc::health::v1::HealthCheckRequest hreq;
  hreq.set_service("tutti.v1.Stager");
  grpc::health::v1::HealthCheckResponse hresp;
  const absl::Time until = absl::Now() + absl::Seconds(20);
  do {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ASSERT_TRUE(health->Check(&ctx, hreq, &hresp).ok());
    if (hresp.status() == grpc::health::v1::HealthCheckResponse::SERVING) break;
    absl::SleepFor(absl::Milliseconds(20));
  } while (absl::Now() < until);
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  // Rank 0 of the job, with its token: refused on the peer address...
  ClientIdentity rank0;
  rank0.rank = 0;
  rank0.job_id = env.job.config().job_id();
  auto peer =
      v1::Stager::NewStub(MakeSecureChannel(absl::StrCat("127.0.0.1:", port), token, rank0));
  auto deadline = [](grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  };
  v1::RegisterRankRequest reg;
  reg.set_rank(0);
  v1::RegisterRankResponse registered;
  std::vector<grpc::Status> refused;
  {
    grpc::ClientContext ctx;
    deadline(&ctx);
    refused.push_back(peer->RegisterRank(&ctx, reg, &registered));
  }
  {
    grpc::ClientContext ctx;
    deadline(&ctx);
    v1::AcquireBatchRequest acq;
    acq.set_rank(0);
    acq.set_timeout_ms(1000);
    v1::BatchDescriptor batch;
    refused.push_back(peer->AcquireBatch(&ctx, acq, &batch));
  }
  {
    grpc::ClientContext ctx;
    deadline(&ctx);
    v1::ReleaseBatchRequest rel;
    rel.set_rank(0);
    v1::ReleaseBatchResponse released;
    refused.push_back(peer->ReleaseBatch(&ctx, rel, &released));
  }
  {
    grpc::ClientContext ctx;
    deadline(&ctx);
    v1::RenewLeasesRequest renew;
    renew.set_rank(0);
    renew.set_incarnation(1);
    v1::RenewLeasesResponse renewed;
    refused.push_back(peer->RenewLeases(&ctx, renew, &renewed));
  }
  {
    grpc::ClientContext ctx;
    deadline(&ctx);
    v1::StageStatus status;
    refused.push_back(peer->GetStageStatus(&ctx, v1::GetStageStatusRequest(), &status));
  }
  for (const grpc::Status& s : refused) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_NE(s.error_message().find("--peer_listen"), std::string::npos) << s.error_message();
  }
  EXPECT_EQ(Metric(server.metrics_port(),
                   "tutti_rpc_refused_total{reason=\"peer_listener\",service=\"tutti.v1.Stager\"}"),
            static_cast<double>(refused.size()));
  // ... and served on the socket.
  auto local = v1::Stager::NewStub(MakeSecureChannel(socket, token, rank0));
  grpc::ClientContext ctx;
  deadline(&ctx);
  grpc::Status s = local->RegisterRank(&ctx, reg, &registered);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// PeerFetcher::Fetch, waited for.
absl::StatusOr<MemberPeers::Bytes> FetchFrom(PeerFetcher& fetcher, uint32_t node,
                                             const v1::FetchMembersRequest& req,
                                             absl::Duration within) {
  absl::Notification done;
  absl::StatusOr<MemberPeers::Bytes> out;
  fetcher.Fetch(node, req.shard(), req.members(0), absl::Now() + within,
                [&](absl::StatusOr<MemberPeers::Bytes> r) {
                  out = std::move(r);
                  done.Notify();
                });
  done.WaitForNotification();
  return out;
}

// A holder whose stager is not up yet (its process starts after this one:
// a job's stagers start together) is waited for, and one still starting (no
// job from its packer yet) is asked again until it has its job, within the
// deadline; one still starting at the deadline is a failure the caller falls
// back on.
TEST(PeerFetcherTest, AStartingHolderIsWaitedForUntilItHasItsJob) {
  Env env("starting", 2, 2, 1);
  env.StartPacker(4);
  env.packer->HoldJob();
  StagerServerOptions o = env.Options(1);
  const std::string socket = env.root + "/holder.sock";
  o.listen = "unix://" + socket;
  PeerFetcher fetcher({{1, o.listen}}, {}, nullptr);
  const v1::FetchMembersRequest req = FirstMembers(env.data, 1);

  // Asked before the holder's process serves anything.
  absl::Notification first_done;
  absl::StatusOr<MemberPeers::Bytes> first;
  fetcher.Fetch(1, req.shard(), req.members(0), absl::Now() + absl::Seconds(30),
                [&](absl::StatusOr<MemberPeers::Bytes> r) {
                  first = std::move(r);
                  first_done.Notify();
                });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(first_done.HasBeenNotified()) << first.status();

  StagerServer holder(o);
  absl::Status started;
  std::thread start([&] { started = holder.Start(); });
  // Its socket is served before it asks the packer for its job.
  for (absl::Time until = absl::Now() + absl::Seconds(30);
       absl::Now() < until && !fs::exists(socket);) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (!fs::exists(socket)) env.packer->ReleaseJob();  // so that `start` ends
  EXPECT_TRUE(fs::exists(socket)) << "the holder never served";

  absl::StatusOr<MemberPeers::Bytes> late = FetchFrom(fetcher, 1, req, absl::Milliseconds(500));
  // Still starting (UNAVAILABLE saying so), or still being connected to
  // (gRPC's reconnection backoff) when the deadline came.
  EXPECT_TRUE(absl::IsUnavailable(late.status()) || absl::IsDeadlineExceeded(late.status()))
      << late.status();

  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(300));
    env.packer->ReleaseJob();
  });
  absl::StatusOr<MemberPeers::Bytes> got = FetchFrom(fetcher, 1, req, absl::Seconds(30));
  release.join();
  start.join();
  first_done.WaitForNotification();
  ASSERT_TRUE(started.ok()) << started;
  const std::string want = MemberBytes(env.data, req.shard(), req.members(0));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(**got, want);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(**first, want);
}

TEST(FetchMembersTest, BoundsAreCheckedBeforeAnythingIsRead) {
  Env env("bounds", 2, 2, 1);
  env.StartPacker(4);
  StagerServer server(env.Options(0));
  ASSERT_TRUE(server.Start().ok());
  const int port = server.grpc_port();

  v1::FetchMembersRequest none = FirstMembers(env.data, 0);
  Fetched r = Fetch(port, none, {});
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("names no member"), std::string::npos);

  v1::FetchMembersRequest many = FirstMembers(env.data, 1);
  while (many.members_size() <= kMaxPeerMembers) *many.add_members() = many.members(0);
  r = Fetch(port, many, {});
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("at most 64"), std::string::npos)
      << r.status.error_message();

  v1::FetchMembersRequest huge = FirstMembers(env.data, 1);
  huge.mutable_shard()->set_size(0);
  huge.mutable_members(0)->set_size(kMaxPeerMemberBytes + 1);
  r = Fetch(port, huge, {});
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  v1::FetchMembersRequest total = FirstMembers(env.data, 1);
  total.mutable_shard()->set_size(0);
  total.mutable_members(0)->set_size(kMaxPeerMemberBytes);
  for (int i = 0; i < 2; ++i) *total.add_members() = total.members(0);
  r = Fetch(port, total, {});
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(r.members.empty());

  // A shard whose name leads outside --source: refused as the stager's own
  // reads are, per member, and nothing outside is opened.
  v1::FetchMembersRequest outside = FirstMembers(env.data, 1);
  outside.mutable_shard()->set_name("../../etc/passwd");
  outside.mutable_shard()->set_size(0);
  r = Fetch(port, outside, {});
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.members.size(), 1u);
  EXPECT_EQ(r.members[0].code(), static_cast<int>(absl::StatusCode::kPermissionDenied))
      << r.members[0].error();
  EXPECT_TRUE(r.members[0].data().empty());
  EXPECT_EQ(Metric(server.metrics_port(),
                   "tutti_stager_path_refusals_total{reason=\"name\",root=\"source\"}"),
            1);
  EXPECT_EQ(
      Metric(server.metrics_port(), "tutti_stager_peer_served_members_total{outcome=\"failed\"}"),
      1);
}

// A shard another node asks for before it is staged here (this node has no
// plan naming it yet, or just restarted) is staged then, and the members
// asked for meanwhile wait for the copy and come from the cache: the source
// is read for the shard once (the copy), never for a member besides.
TEST(FetchMembersTest, AShardAskedForIsStagedThenServedFromTheCache) {
  Env env("demand", 2, 2, 1);
  // A deadline a loaded host keeps: the members wait up to half of it for the
  // copy before they are read from the source.
  env.job.mutable_config()->set_sample_deadline_ms(20000);
  env.StartPacker(4, {}, /*gated=*/true);  // no plans: this node stages nothing of its own
  StagerServer server(env.Options(0));
  ASSERT_TRUE(server.Start().ok());
  const int metrics = server.metrics_port();
  const v1::FetchMembersRequest first = FirstMembers(env.data, 2);
  Fetched fetched = Fetch(server.grpc_port(), first, {});
  ASSERT_TRUE(fetched.status.ok()) << fetched.status.error_message();
  ASSERT_EQ(fetched.members.size(), 2u);
  for (const auto& [i, m] : fetched.members) {
    EXPECT_EQ(m.data(), MemberBytes(env.data, first.shard(), first.members(static_cast<int>(i))));
  }
  const v1::ShardRef& shard = env.data.shards[0];
  ASSERT_TRUE(Staged(server).count(shard.name())) << "shard " << shard.name() << " not staged";
  EXPECT_EQ(Metric(metrics, "tutti_stager_source_bytes_total"), static_cast<double>(shard.size()));

  const v1::FetchMembersRequest all = FirstMembers(env.data, 16);
  Fetched again = Fetch(server.grpc_port(), all, {});
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  ASSERT_EQ(again.members.size(), 16u);
  for (const auto& [i, m] : again.members) {
    EXPECT_EQ(m.data(), MemberBytes(env.data, shard, all.members(static_cast<int>(i))));
  }
  EXPECT_EQ(Metric(metrics, "tutti_stager_source_bytes_total"), static_cast<double>(shard.size()));
  env.packer->Open();
}

// The homes of the dataset's shards over `nodes` (one each), as the packer
// assigns them with the job's locality.
ShardHomes HomesOf(const Env& env, uint32_t nodes) {
  std::vector<ShardKey> keys;
  for (const v1::ShardRef& s : env.data.shards) keys.push_back({s.name(), s.size()});
  ShardHomesOptions o;
  o.seed = env.job.config().seed();
  auto homes = ShardHomes::Assign(keys, nodes, o);
  EXPECT_TRUE(homes.ok()) << homes.status();
  return *homes;
}

// What the packer's placement does with locality for a node that is not a
// shard's home: its items there are remote_load and name their holder.
// Counts the members so marked per node (images and k.json documents).
struct RemoteMarks {
  std::map<std::string, uint32_t> home;  // shard name -> home node
  std::shared_ptr<std::mutex> mu = std::make_shared<std::mutex>();
  std::shared_ptr<std::map<uint32_t, std::set<std::pair<uint64_t, uint64_t>>>> marked =
      std::make_shared<std::map<uint32_t, std::set<std::pair<uint64_t, uint64_t>>>>();

  void operator()(v1::StepPlan* plan) const {
    std::map<uint64_t, std::string> shard_of;
    for (const v1::SampleInfo& s : plan->samples()) {
      shard_of[s.sample_id()] = plan->shards(static_cast<int>(s.shard())).name();
    }
    std::lock_guard<std::mutex> l(*mu);
    for (v1::RankPlan& rp : *plan->mutable_ranks()) {
      const uint32_t node = rp.node();
      for (v1::EncoderPhase& enc : *rp.mutable_encoders()) {
        for (v1::ImagePlan& ip : *enc.mutable_images()) {
          const uint32_t holder = home.at(shard_of.at(ip.sample_id()));
          if (holder == node) continue;
          ip.set_remote_load(true);
          ip.set_holder_node(holder);
          (*marked)[node].insert({plan->step(), ip.sample_id() * 2});
        }
      }
      for (v1::MicroBatch& mb : *rp.mutable_micro_batches()) {
        for (v1::Sequence& seq : *mb.mutable_sequences()) {
          for (v1::DocSlot& doc : *seq.mutable_docs()) {
            const uint32_t holder = home.at(shard_of.at(doc.sample_id()));
            if (holder == node) continue;
            doc.set_remote_load(true);
            doc.set_holder_node(holder);
            (*marked)[node].insert({plan->step(), doc.sample_id() * 2 + 1});
          }
        }
      }
    }
  }
  // Members marked remote_load on `node` over the steps planned.
  size_t On(uint32_t node) const {
    std::lock_guard<std::mutex> l(*mu);
    return (*marked)[node].size();
  }
};

RemoteMarks MarksOf(const Env& env, const ShardHomes& homes) {
  RemoteMarks marks;
  for (uint32_t i = 0; i < env.data.shards.size(); ++i) {
    marks.home[env.data.shards[i].name()] = homes.Homes(i)[0];
  }
  return marks;
}

// Takes steps [first, end) for every rank of `node` from its stager; every
// batch must be whole (nothing skipped) and no sample is planned on two
// ranks of a step (`seen`, by step, shared by the nodes).
struct Served {
  std::mutex mu;
  std::map<uint64_t, std::multiset<uint64_t>> images;  // step -> image sample ids
};
void TakeRange(StagerServer& server, uint32_t node, uint32_t ranks_per_node, uint64_t first,
               uint64_t end, Served* served) {
  for (uint64_t step = first; step < end; ++step) {
    for (uint32_t r = node * ranks_per_node; r < (node + 1) * ranks_per_node; ++r) {
      absl::StatusOr<v1::BatchDescriptor> d = server.core()->Acquire(step, r, 60000);
      ASSERT_TRUE(d.ok()) << "node " << node << " step " << step << " rank " << r << ": "
                          << d.status();
      EXPECT_EQ(d->skipped_size(), 0)
          << "node " << node << " step " << step << " rank " << r << ": " << d->skipped(0).reason()
          << " " << d->skipped(0).detail();
      {
        std::lock_guard<std::mutex> l(served->mu);
        for (const v1::EncoderPhase& e : d->plan().encoders()) {
          for (const v1::ImagePlan& ip : e.images()) served->images[step].insert(ip.sample_id());
        }
      }
      ASSERT_TRUE(server.core()->Release(step, r).ok());
    }
  }
}

// With locality a plan lists the shards the step reads on other nodes that
// this node is home to (StepPlan.held_shards). Such a shard, which none of
// this node's ranks read, is staged ahead like its ranks' own shards, and is
// kept in the cache under pressure until its step has passed: a peer's
// staging demand that needs its room is refused meanwhile and served from
// the source; once the step passed, the room is taken.
TEST(StagerPeersTest, AHomeShardOnlyPeersReadIsStagedAheadAndKeptUntilItsStepPassed) {
  constexpr uint64_t kSteps = 4, kHeldAt = 3;
  // Node 0 of two (one rank each): its rank reads shard 0 in steps 0-1 and
  // shard 1 in steps 2-3 (testing::MakePlan, two samples a step); node 1's
  // ranks read shard 5 in step 3, and node 0 is its home.
  Env env("held", 6, 2, 1);
  env.job.mutable_config()->mutable_locality()->set_home_replication(1);
  const v1::ShardRef held = env.data.shards[5];
  env.StartPacker(kSteps, [held](v1::StepPlan* plan) {
    if (plan->step() == kHeldAt) *plan->add_held_shards() = held;
  });
  StagerServerOptions o = env.Options(0);
  // Room for exactly what the plans of steps 0-3 name.
  o.core.cache_capacity_bytes = env.data.shards[0].size() + env.data.shards[1].size() + held.size();
  o.core.staging.retry_after = absl::Milliseconds(20);
  o.core.staging.max_retry_after = absl::Milliseconds(20);
  StagerServer server(o);
  ASSERT_TRUE(server.Start().ok());
  const int metrics = server.metrics_port();

  // Staged ahead: before any rank asked for a batch.
  absl::Time until = absl::Now() + absl::Seconds(30);
  while (absl::Now() < until && Staged(server).size() < 3) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ(Staged(server), (std::set<std::string>{env.data.shards[0].name(),
                                                   env.data.shards[1].name(), held.name()}));
  EXPECT_EQ(Metric(metrics, "tutti_stager_source_bytes_total"),
            static_cast<double>(o.core.cache_capacity_bytes));

  // Cache pressure while step 3 is in the window: a peer asks for members of
  // shard 4, which no plan names; staging it needs room that only the held
  // shard could give. It is refused, and the members come from the source.
  v1::FetchMembersRequest other;
  *other.mutable_shard() = env.data.shards[4];
  for (const v1::SampleInfo& s : env.data.samples) {
    if (s.shard() == 4 && other.members_size() < 2) *other.add_members() = s.images(0);
  }
  Fetched fetched = Fetch(server.grpc_port(), other, {});
  ASSERT_TRUE(fetched.status.ok()) << fetched.status.error_message();
  ASSERT_EQ(fetched.members.size(), 2u);
  for (const auto& [i, m] : fetched.members) {
    EXPECT_EQ(m.data(), MemberBytes(env.data, other.shard(), other.members(static_cast<int>(i))));
  }
  EXPECT_TRUE(server.core()->cache()->Has(held.name(), held.size()))
      << "the held shard was evicted before its step";
  EXPECT_EQ(server.core()->cache()->evictions(), 0u);

  // Its members are served from the cache: the source is not read again.
  v1::FetchMembersRequest mine;
  *mine.mutable_shard() = held;
  for (const v1::SampleInfo& s : env.data.samples) {
    if (s.shard() == 5 && mine.members_size() < 2) *mine.add_members() = s.images(0);
  }
  const double source = Metric(metrics, "tutti_stager_source_bytes_total");
  fetched = Fetch(server.grpc_port(), mine, {});
  ASSERT_TRUE(fetched.status.ok()) << fetched.status.error_message();
  ASSERT_EQ(fetched.members.size(), 2u);
  for (const auto& [i, m] : fetched.members) {
    EXPECT_EQ(m.data(), MemberBytes(env.data, held, mine.members(static_cast<int>(i))));
  }
  EXPECT_EQ(Metric(metrics, "tutti_stager_source_bytes_total"), source);

  // Steps 0-3 pass: nothing pins the held shard any more, and staging shard
  // 4 takes room from the shards no plan in the window names.
  Served served;
  TakeRange(server, 0, 1, 0, kSteps, &served);
  until = absl::Now() + absl::Seconds(30);
  while (absl::Now() < until && !Staged(server).count(other.shard().name())) {
    fetched = Fetch(server.grpc_port(), other, {});
    ASSERT_TRUE(fetched.status.ok()) << fetched.status.error_message();
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(Staged(server).count(other.shard().name()));
  EXPECT_GT(server.core()->cache()->evictions(), 0u);
}

// `nodes` stagers as `nodes` nodes of two ranks each, each home to its shards
// (ShardHomes, replication 1): the members of other nodes' shards come from
// their home node's stager, each once, never from the source; each stager
// stages only its home shards; every planned image is served once.
void RunCluster(uint32_t nodes) {
  constexpr uint64_t kSteps = 8;
  constexpr uint32_t kRanksPerNode = 2;
  Env env(absl::StrCat("cluster", nodes), 2 * static_cast<int>(nodes), nodes * kRanksPerNode,
          kRanksPerNode);
  env.job.mutable_config()->mutable_locality()->set_home_replication(1);
  const RemoteMarks marks = MarksOf(env, HomesOf(env, nodes));
  env.StartPacker(kSteps, marks, /*gated=*/true);
  std::map<uint32_t, std::string> peers;
  for (uint32_t n = 0; n < nodes; ++n)
    peers[n] = absl::StrCat("unix://", env.root, "/s", n, ".sock");
  std::vector<std::unique_ptr<StagerServer>> servers;
  for (uint32_t n = 0; n < nodes; ++n) {
    StagerServerOptions o = env.Options(n);
    o.listen = peers[n];
    o.peers = peers;
    servers.push_back(std::make_unique<StagerServer>(o));
    ASSERT_TRUE(servers.back()->Start().ok());
  }
  env.packer->Open();
  Served served;
  std::vector<std::thread> threads;
  for (uint32_t n = 0; n < nodes; ++n) {
    threads.emplace_back([&, n] { TakeRange(*servers[n], n, kRanksPerNode, 0, kSteps, &served); });
  }
  for (auto& t : threads) t.join();

  double sent = 0, received = 0, moved = 0, calls = 0, served_members = 0;
  for (uint32_t n = 0; n < nodes; ++n) {
    const int port = servers[n]->metrics_port();
    SCOPED_TRACE(absl::StrCat("node ", n));
    calls += Metric(port, "tutti_stager_peer_served_calls_total");
    served_members += Metric(port, "tutti_stager_peer_served_members_total{outcome=\"sent\"}");
    EXPECT_EQ(Metric(port, "tutti_stager_peer_members_total{outcome=\"received\"}"),
              static_cast<double>(marks.On(n)));
    EXPECT_EQ(Metric(port, "tutti_stager_peer_members_total{outcome=\"fallback\"}"), 0);
    sent += Metric(port, "tutti_stager_peer_bytes_total{direction=\"sent\"}");
    received += Metric(port, "tutti_stager_peer_bytes_total{direction=\"received\"}");
    moved += static_cast<double>(marks.On(n));
    // Only home shards are staged, so no other shard is read from the source
    // here (a member of one would be a fallback, and there is none).
    for (const std::string& shard : Staged(*servers[n])) {
      EXPECT_EQ(marks.home.at(shard), n) << shard << " staged on node " << n;
    }
  }
  EXPECT_GT(moved, 0) << "the test's plans must move something";
  EXPECT_EQ(sent, received);
  // The members a step needs of one shard from one holder go in one call,
  // not one call each.
  EXPECT_EQ(served_members, moved);
  EXPECT_LT(calls, served_members) << calls << " calls for " << served_members << " members";
  std::cout << nodes << " nodes, " << kSteps << " steps: " << served_members << " members in "
            << calls << " FetchMembers calls\n";
  for (uint64_t step = 0; step < kSteps; ++step) {
    const std::multiset<uint64_t>& ids = served.images[step];
    EXPECT_EQ(ids.size(), size_t{nodes} * kRanksPerNode * 2) << "step " << step;
    EXPECT_EQ(std::set<uint64_t>(ids.begin(), ids.end()).size(), ids.size()) << "step " << step;
  }
}

TEST(StagerPeersTest, TwoNodesFetchEachOthersMembersOnceAndStageOnlyTheirHomeShards) {
  RunCluster(2);
}

TEST(StagerPeersTest, FourNodesOfTwoRanksFetchFromTheirHoldersOnce) { RunCluster(4); }

// A holder's stager stopped mid-epoch and restarted: the other node's
// batches stay whole (its members come from the source meanwhile), each
// member is asked of the holder at most once, and the restarted stager
// serves its ranks' remaining steps.
TEST(StagerPeersTest, AHolderRestartedMidEpochLosesNothing) {
  constexpr uint64_t kSteps = 12, kStopAt = 4;
  Env env("restart", 4, 4, 2);
  env.job.mutable_config()->mutable_locality()->set_home_replication(1);
  const RemoteMarks marks = MarksOf(env, HomesOf(env, 2));
  env.StartPacker(kSteps, marks, /*gated=*/true);
  std::map<uint32_t, std::string> peers = {{0, "unix://" + env.root + "/s0.sock"},
                                           {1, "unix://" + env.root + "/s1.sock"}};
  auto options = [&](uint32_t n) {
    StagerServerOptions o = env.Options(n);
    o.listen = peers[n];
    o.peers = peers;
    o.core.peer_timeout_ms = 500;
    return o;
  };
  auto node0 = std::make_unique<StagerServer>(options(0));
  auto node1 = std::make_unique<StagerServer>(options(1));
  ASSERT_TRUE(node0->Start().ok());
  ASSERT_TRUE(node1->Start().ok());
  env.packer->Open();
  Served served;
  std::thread first([&] { TakeRange(*node0, 0, 2, 0, kSteps, &served); });
  TakeRange(*node1, 1, 2, 0, kStopAt, &served);
  node1->Shutdown();
  node1.reset();
  absl::SleepFor(absl::Milliseconds(200));
  node1 = std::make_unique<StagerServer>(options(1));
  ASSERT_TRUE(node1->Start().ok());
  TakeRange(*node1, 1, 2, kStopAt, kSteps, &served);
  first.join();

  const int port = node0->metrics_port();
  EXPECT_EQ(Metric(port, "tutti_stager_peer_members_total{outcome=\"received\"}") +
                Metric(port, "tutti_stager_peer_members_total{outcome=\"fallback\"}"),
            static_cast<double>(marks.On(0)));
  for (uint64_t step = 0; step < kSteps; ++step) {
    const std::multiset<uint64_t>& ids = served.images[step];
    EXPECT_EQ(ids.size(), 8u) << "step " << step;
    EXPECT_EQ(std::set<uint64_t>(ids.begin(), ids.end()).size(), ids.size()) << "step " << step;
  }
}

// A holder's stager that takes the call and never answers.
class StallingStager final : public v1::Stager::Service {
 public:
  grpc::Status FetchMembers(grpc::ServerContext* ctx, const v1::FetchMembersRequest* req,
                            grpc::ServerWriter<v1::FetchedMember>*) override {
    ++calls;
    members += req->members_size();
    while (!ctx->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
    return grpc::Status(grpc::StatusCode::CANCELLED, "stalled");
  }
  std::atomic<int> calls{0};
  std::atomic<int> members{0};  // over all calls
};

// A holder that stalls past --peer_timeout_ms, and one that is gone: every
// member is read from the source within the sample deadline, nothing is
// skipped, and each member is asked of the holder once (in calls of several).
TEST(StagerPeersTest, AHolderThatStallsOrIsGoneFallsBackToTheSource) {
  constexpr uint64_t kSteps = 4;
  for (const bool stalls : {true, false}) {
    SCOPED_TRACE(stalls ? "stalls" : "gone");
    Env env(stalls ? "stall" : "gone", 4, 4, 2);
    env.job.mutable_config()->mutable_locality()->set_home_replication(1);
    env.job.mutable_config()->set_sample_deadline_ms(5000);
    const RemoteMarks marks = MarksOf(env, HomesOf(env, 2));
    env.StartPacker(kSteps, marks);
    StallingStager holder;
    std::unique_ptr<GrpcServer> holder_server;
    const std::string holder_address = "unix://" + env.root + "/holder.sock";
    if (stalls) {
      int unused = 0;
      auto s = StartGrpcServer(holder_address, {&holder}, &unused);
      ASSERT_TRUE(s.ok()) << s.status();
      holder_server = std::move(*s);
    }
    StagerServerOptions o = env.Options(0);
    o.peers = {{1, holder_address}};
    o.core.peer_timeout_ms = 300;
    StagerServer server(o);
    ASSERT_TRUE(server.Start().ok());
    Served served;
    TakeRange(server, 0, 2, 0, kSteps, &served);
    const int port = server.metrics_port();
    ASSERT_GT(marks.On(0), 0u);
    EXPECT_EQ(Metric(port, "tutti_stager_peer_members_total{outcome=\"fallback\"}"),
              static_cast<double>(marks.On(0)));
    EXPECT_EQ(Metric(port, "tutti_stager_peer_members_total{outcome=\"received\"}"), 0);
    if (stalls) {
      EXPECT_EQ(holder.members.load(), static_cast<int>(marks.On(0)));
      EXPECT_GE(holder.calls.load(), 1);
      EXPECT_LT(holder.calls.load(), holder.members.load());
    }
    EXPECT_GT(Metric(port, "tutti_stager_source_bytes_total"), 0);
  }
}

}  // namespace
}  // namespace tutti::stager
