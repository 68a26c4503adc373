// Stager to stager across nodes: real tutti-stagerd servers (StagerServer,
// in process) on loopback as the nodes of one job, each home to its shards
// (ShardHomes), fetching the members of other nodes' shards from their
// holder (then the source when the holder fails, stalls or is late), and a
// home node's stager staging ahead the shards only peers read.
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/shard_homes.h"
#include "gtest/gtest.h"
#include "services/stager/stager_server.h"
#include "tests/stager_peers_testing.h"
#include "tools/slowfs_mount.h"

namespace tutti::stager {
namespace {

namespace fs = std::filesystem;
using peers_testing::Env;
using peers_testing::Fetch;
using peers_testing::Fetched;
using peers_testing::MemberBytes;
using peers_testing::Metric;
using peers_testing::Staged;

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

  // The shards evicted for it are no longer reported staged, nor counted in
  // the staged bytes; one a peer asks for again is staged again.
  std::vector<v1::ShardRef> evicted;
  for (const v1::ShardRef& shard : {env.data.shards[0], env.data.shards[1], held}) {
    if (!fs::exists(server.core()->cache()->PathOf(shard.name()))) evicted.push_back(shard);
  }
  ASSERT_FALSE(evicted.empty());
  const std::set<std::string> staged = Staged(server);
  for (const v1::ShardRef& shard : evicted) {
    EXPECT_FALSE(staged.count(shard.name())) << shard.name() << " evicted, still reported staged";
  }
  const v1::StageStatus status = server.core()->GetStageStatus();
  EXPECT_EQ(status.staged_files(), staged.size());
  EXPECT_EQ(status.staged_bytes(), server.core()->cache()->cached_bytes());
  EXPECT_EQ(Metric(metrics, "tutti_stager_cache_bytes"),
            static_cast<double>(server.core()->cache()->cached_bytes()));
  v1::FetchMembersRequest again;
  *again.mutable_shard() = evicted[0];
  for (const v1::SampleInfo& s : env.data.samples) {
    if (env.data.shards[s.shard()].name() == evicted[0].name() && again.members_size() < 2) {
      *again.add_members() = s.images(0);
    }
  }
  until = absl::Now() + absl::Seconds(30);
  const std::string copy = server.core()->cache()->PathOf(evicted[0].name());
  auto staged_again = [&] { return Staged(server).count(evicted[0].name()) && fs::exists(copy); };
  while (absl::Now() < until && !staged_again()) {
    fetched = Fetch(server.grpc_port(), again, {});
    ASSERT_TRUE(fetched.status.ok()) << fetched.status.error_message();
    for (const auto& [i, m] : fetched.members) {
      EXPECT_EQ(m.data(), MemberBytes(env.data, evicted[0], again.members(static_cast<int>(i))));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(staged_again()) << evicted[0].name()
                              << " was not staged again when a peer asked for it";
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

// A holder whose source answers for some members and stalls on the others
// (tutti-slowfs: half the images another node asks for never answer): each of its FetchMembers
// calls sends the members it could read and then nothing. The asking stager uses the members sent,
// reads the rest from the source once the call's deadline passed, and drops whatever comes later:
// every member is either received or read from the source, never both, and every batch is whole.
TEST(StagerPeersTest, AHolderThatSendsSomeMembersThenStallsLosesNothing) {
  if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "/dev/fuse is not available";
  constexpr uint64_t kSteps = 4;
  Env env("partial", 4, 4, 2);
  env.job.mutable_config()->mutable_locality()->set_home_replication(1);
  env.job.mutable_config()->set_sample_deadline_ms(20000);
  const RemoteMarks marks = MarksOf(env, HomesOf(env, 2));
  env.StartPacker(kSteps, marks, /*gated=*/true);
  // Of the images node 0's ranks read from node 1 in each step, every other
  // one stalls at node 1's source (their byte ranges never answer): each
  // call for a step's members of a shard has members sent and members not.
  std::vector<std::string> stalls;
  for (uint64_t step = 0; step < kSteps; ++step) {
    const v1::StepPlan plan = env.packer->Plan(step, {0, 1});
    std::map<uint64_t, uint32_t> shard_of;
    for (const v1::SampleInfo& s : plan.samples()) shard_of[s.sample_id()] = s.shard();
    bool stall = false;
    for (const v1::RankPlan& rp : plan.ranks()) {
      for (const v1::EncoderPhase& e : rp.encoders()) {
        for (const v1::ImagePlan& ip : e.images()) {
          if (!ip.remote_load() || !(stall = !stall)) continue;
          const v1::ShardRef& shard = plan.shards(static_cast<int>(shard_of.at(ip.sample_id())));
          for (const v1::SampleInfo& s : env.data.samples) {
            if (s.sample_id() != ip.sample_id()) continue;
            stalls.push_back(
                absl::StrCat(shard.name(), "@", s.images(0).offset(), "+", s.images(0).size()));
          }
        }
      }
    }
  }
  ASSERT_FALSE(stalls.empty());
  // Normalized: /proc/mounts names the mount point without a doubled slash.
  const std::string slow = std::filesystem::path(env.root + "/slow").lexically_normal().string();
  auto mount =
      std::make_unique<tools::SlowfsMount>(TUTTI_SLOWFS_BINARY, env.data.dir, slow, 2.0, stalls);
  if (!mount->ok()) GTEST_SKIP() << "could not mount tutti-slowfs";

  StagerServerOptions ho = env.Options(1);
  ho.listen = "unix://" + env.root + "/s1.sock";
  ho.core.staging.source_dir = slow;
  ho.core.staging.op_timeout = absl::Seconds(2);  // its own copies give up on the stall
  auto holder = std::make_unique<StagerServer>(ho);
  ASSERT_TRUE(holder->Start().ok());
  StagerServerOptions o = env.Options(0);
  o.peers = {{1, ho.listen}};
  o.core.peer_timeout_ms = 3000;
  auto node0 = std::make_unique<StagerServer>(o);
  ASSERT_TRUE(node0->Start().ok());
  env.packer->Open();
  Served served;
  TakeRange(*node0, 0, 2, 0, kSteps, &served);

  const int port = node0->metrics_port();
  const double received = Metric(port, "tutti_stager_peer_members_total{outcome=\"received\"}");
  const double fallback = Metric(port, "tutti_stager_peer_members_total{outcome=\"fallback\"}");
  EXPECT_GT(received, 0) << "the holder sent nothing: the test's stalls cover too much";
  EXPECT_GT(fallback, 0) << "the holder never stalled: the test's stalls cover too little";
  EXPECT_EQ(received + fallback, static_cast<double>(marks.On(0)));
  // Nothing read twice: the source gave node 0 its home shards' copies and
  // the members its holder did not send, and the holder the rest.
  std::map<uint64_t, const v1::SampleInfo*> sample;
  for (const v1::SampleInfo& s : env.data.samples) sample[s.sample_id()] = &s;
  double marked_bytes = 0;
  {
    std::lock_guard<std::mutex> l(*marks.mu);
    for (const auto& [step, key] : (*marks.marked)[0]) {
      const v1::SampleInfo& s = *sample.at(key / 2);
      marked_bytes += static_cast<double>(key % 2 == 0 ? s.images(0).size() : s.text().size());
    }
  }
  double staged_bytes = 0;
  for (const std::string& name : Staged(*node0)) {
    for (const v1::ShardRef& shard : env.data.shards) {
      if (shard.name() == name) staged_bytes += static_cast<double>(shard.size());
    }
  }
  EXPECT_EQ(Metric(port, "tutti_stager_source_bytes_total") - staged_bytes +
                Metric(port, "tutti_stager_peer_bytes_total{direction=\"received\"}"),
            marked_bytes);
  for (uint64_t step = 0; step < kSteps; ++step) {
    const std::multiset<uint64_t>& ids = served.images[step];
    EXPECT_EQ(ids.size(), 4u) << "step " << step;
    EXPECT_EQ(std::set<uint64_t>(ids.begin(), ids.end()).size(), ids.size()) << "step " << step;
  }
  // The stalled reads end with the mount, then the stagers stop.
  mount.reset();
  node0.reset();
  holder.reset();
}

}  // namespace
}  // namespace tutti::stager