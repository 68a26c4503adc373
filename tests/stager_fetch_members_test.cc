// Stager to stager, the holder's side: FetchMembers served by a real
// tutti-stagerd server (StagerServer, in process) on loopback (the job's
// token, the request's bounds, member bytes as stored in the shard, staging
// on demand), --peer_listen, the --peers flag, and PeerFetcher asking a
// holder that is still starting.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "services/stager/member_stream.h"
#include "services/stager/peer_fetcher.h"
#include "services/stager/stager_server.h"
#include "tests/stager_peers_testing.h"

namespace tutti::stager {
namespace {

namespace fs = std::filesystem;
using peers_testing::Env;
using peers_testing::Fetch;
using peers_testing::Fetched;
using peers_testing::FirstMembers;
using peers_testing::MemberBytes;
using peers_testing::Metric;
using peers_testing::Staged;

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
}  // namespace
}  // namespace tutti::stager
