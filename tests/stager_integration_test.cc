// tutti-stagerd over gRPC against a small tutti.v1.Packer test fixture that
// serves precomputed plans (the end-to-end test with tutti-packerd lives
// with the packer). Covers plan intake, AcquireBatch/ReleaseBatch through
// shared memory, /metrics, a packer that starts late, a step the packer
// cannot serve, a port in use, and SIGTERM on the real daemon.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/grpc_status.h"
#include "common/rpc_security.h"
#include "common/shm.h"
#include "gtest/gtest.h"
#include "services/stager/stager_server.h"
#include "services/stager/test_dataset.h"
#include "tutti/v1/packer.grpc.pb.h"
#include "tutti/v1/stager.grpc.pb.h"

namespace tutti::stager {
namespace {

namespace fs = std::filesystem;

// Test fixture: serves GetJob and plans computed by testing::MakePlan, up
// to (not including) `end_step`, after which StreamPlans reports
// OUT_OF_RANGE as a packer does at the end of the dataset. A stream ends at
// the request's end_step (0 = never). Like tutti-packerd, it writes as fast
// as gRPC accepts the writes (buffered, not read). With `hang_at`, a stream
// stops sending at that step and hangs until cancelled (a packer that dies
// mid-stream).
class FixturePacker final : public v1::Packer::Service {
 public:
  FixturePacker(testing::Dataset data, v1::JobInfo job, uint64_t end_step,
                uint64_t hang_at = ~uint64_t{0})
      : data_(std::move(data)), job_(std::move(job)), end_(end_step), hang_at_(hang_at) {}
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::JobInfo* out) override {
    *out = job_;
    return grpc::Status::OK;
  }
  grpc::Status StreamPlans(grpc::ServerContext* ctx, const v1::StreamPlansRequest* req,
                           grpc::ServerWriter<v1::StepPlan>* w) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      starts_.push_back(req->start_step());
    }
    std::vector<uint32_t> ranks(req->ranks().begin(), req->ranks().end());
    const uint64_t stop = req->end_step() == 0 ? ~uint64_t{0} : req->end_step();
    for (uint64_t s = req->start_step(); s < stop && !ctx->IsCancelled(); ++s) {
      while (s >= hang_at_ && !ctx->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
      if (ctx->IsCancelled()) break;
      if (s >= end_) {
        return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                            "step " + std::to_string(s) + " is past the end of the dataset");
      }
      if (!w->Write(testing::MakePlan(data_, job_, s, ranks, 2))) break;
      std::lock_guard<std::mutex> l(mu_);
      ++written_;
      highest_ = std::max(highest_, s);
    }
    return grpc::Status::OK;
  }
  grpc::Status GetPlan(grpc::ServerContext*, const v1::GetPlanRequest* req, v1::StepPlan* out) override {
    *out = testing::MakePlan(data_, job_, req->step(), {req->ranks().begin(), req->ranks().end()}, 2);
    return grpc::Status::OK;
  }
  // start_step of every StreamPlans call, in order.
  std::vector<uint64_t> starts() {
    std::lock_guard<std::mutex> l(mu_);
    return starts_;
  }
  // Plans written to streams, and the highest step written.
  std::pair<uint64_t, uint64_t> written() {
    std::lock_guard<std::mutex> l(mu_);
    return {written_, highest_};
  }

 private:
  std::mutex mu_;
  std::vector<uint64_t> starts_;
  uint64_t written_ = 0, highest_ = 0;
  testing::Dataset data_;
  v1::JobInfo job_;
  uint64_t end_;
  uint64_t hang_at_;
};

struct Env {
  std::string root;
  testing::Dataset data;
  v1::JobInfo job;
  std::unique_ptr<FixturePacker> packer;
  std::unique_ptr<GrpcServer> packer_server;
  int packer_port = 0;

  explicit Env(const std::string& name, uint64_t end_step = 6) {
    root = ::testing::TempDir() + "/stagerd_" + name + "_" + std::to_string(::getpid());
    fs::remove_all(root);
    data = testing::WriteDataset(root + "/src", {.shards = 2, .samples_per_shard = 8});
    job = testing::MakeJob(data, 4, 2);
    job.mutable_config()->set_job_id("itest-" + name);
    packer = std::make_unique<FixturePacker>(data, job, end_step);
  }
  void StartPacker(int port = 0) {
    auto s = StartGrpcServer("127.0.0.1:" + std::to_string(port), {packer.get()}, &packer_port);
    ASSERT_TRUE(s.ok()) << s.status();
    packer_server = std::move(*s);
  }
  StagerServerOptions Options() {
    StagerServerOptions o;
    o.packer = "127.0.0.1:" + std::to_string(packer_port);
    o.listen = "127.0.0.1:0";
    o.metrics = "127.0.0.1:0";
    o.packer_wait = absl::Seconds(20);
    o.core.node = 0;
    o.core.cache_dir = root + "/cache";
    o.core.staging.source_dir = data.dir;
    o.core.staging.queue_depth = 8;
    o.core.staging.block_size = 65536;
    o.core.decode_threads = 2;
    o.core.window = 2;
    o.core.stage_ahead = 2;
    return o;
  }
};

std::unique_ptr<v1::Stager::Stub> Client(int port) {
  return v1::Stager::NewStub(MakeChannel("127.0.0.1:" + std::to_string(port)));
}

// A rank's process as the stager issued it (none: a client that names none).
struct Process {
  uint64_t incarnation = 0;
  std::string key;
};

// A new process of `rank` registers, saying which rank it is.
Process Register(int port, uint32_t rank) {
  auto stub = v1::Stager::NewStub(
      MakeSecureChannel("127.0.0.1:" + std::to_string(port), {}, ClientIdentity{rank, ""}));
  grpc::ClientContext ctx;
  v1::RegisterRankRequest req;
  req.set_rank(rank);
  v1::RegisterRankResponse resp;
  grpc::Status s = stub->RegisterRank(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return Process{resp.incarnation(), resp.key()};
}

grpc::Status Acquire(v1::Stager::Stub& stub, uint64_t step, uint32_t rank, uint32_t timeout_ms,
                     v1::BatchDescriptor* out, const Process& p = {}) {
  grpc::ClientContext ctx;
  v1::AcquireBatchRequest req;
  req.set_step(step);
  req.set_rank(rank);
  req.set_timeout_ms(timeout_ms);
  req.set_incarnation(p.incarnation);
  req.set_key(p.key);
  return stub.AcquireBatch(&ctx, req, out);
}

grpc::Status Release(v1::Stager::Stub& stub, uint64_t step, uint32_t rank, const Process& p = {}) {
  grpc::ClientContext ctx;
  v1::ReleaseBatchRequest req;
  req.set_step(step);
  req.set_rank(rank);
  req.set_incarnation(p.incarnation);
  req.set_key(p.key);
  v1::ReleaseBatchResponse resp;
  return stub.ReleaseBatch(&ctx, req, &resp);
}

std::string HttpGet(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  [[maybe_unused]] ssize_t w = ::write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

TEST(StagerDaemonTest, ServesBatchesOverGrpcAndSharedMemory) {
  Env env("grpc");
  env.StartPacker();
  StagerServer server(env.Options());
  ASSERT_TRUE(server.Start().ok());
  auto stub = Client(server.grpc_port());
  for (uint64_t step = 0; step < 4; ++step) {
    for (uint32_t rank : {0u, 1u}) {
      v1::BatchDescriptor d;
      grpc::Status s = Acquire(*stub, step, rank, 20000, &d);
      ASSERT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(d.step(), step);
      EXPECT_EQ(d.plan().rank(), rank);
      auto seg = ShmSegment::Open(d.shm_name(), false);
      ASSERT_TRUE(seg.ok()) << seg.status();
      EXPECT_EQ((*seg)->size(), d.shm_size());
      grpc::ClientContext ctx;
      v1::ReleaseBatchRequest rel;
      rel.set_step(step);
      rel.set_rank(rank);
      v1::ReleaseBatchResponse resp;
      ASSERT_TRUE(stub->ReleaseBatch(&ctx, rel, &resp).ok());
    }
  }
  v1::BatchDescriptor d;
  grpc::Status wrong = Acquire(*stub, 4, 3, 100, &d);
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(wrong.error_message().find("serves node 0 (ranks 0..1)"), std::string::npos) << wrong.error_message();
  // Every batch was released: a client asking for an earlier step (a job
  // resuming from a checkpoint) moves the window back and gets it.
  grpc::Status old = Acquire(*stub, 1, 0, 20000, &d);
  ASSERT_TRUE(old.ok()) << old.error_message();
  EXPECT_EQ(d.step(), 1u);
  EXPECT_EQ(d.plan().rank(), 0u);
  const std::string metrics = HttpGet(server.metrics_port(), "/metrics");
  for (const char* name : {"tutti_stager_staged_bytes_total", "tutti_stager_cache_misses_total",
                           "tutti_stager_decode_seconds", "tutti_stager_client_wait_seconds",
                           "tutti_stager_window_batches", "tutti_stager_skipped_samples_total"}) {
    EXPECT_NE(metrics.find(name), std::string::npos) << name;
  }
  grpc::ClientContext sctx;
  v1::StageStatus st;
  ASSERT_TRUE(stub->GetStageStatus(&sctx, v1::GetStageStatusRequest(), &st).ok());
  EXPECT_EQ(st.staged_files(), 2u);
  server.Shutdown();
}

// The value of an unlabelled metric in a /metrics page (-1 if absent).
double MetricValue(const std::string& page, const std::string& name) {
  size_t at = 0;
  while ((at = page.find(name + " ", at)) != std::string::npos) {
    if (at == 0 || page[at - 1] == '\n') return std::stod(page.substr(at + name.size() + 1));
    at += name.size();
  }
  return -1;
}

TEST(StagerDaemonTest, PackerRestartMidStreamLosesAndRepeatsNoStep) {
  const uint64_t kSteps = 12, kDiesAt = 6;
  Env env("restart", kSteps);
  env.packer = std::make_unique<FixturePacker>(env.data, env.job, kSteps, kDiesAt);
  env.StartPacker();
  const int port = env.packer_port;
  StagerServer server(env.Options());  // window 2, stage_ahead 2: plans arrive as steps are released
  ASSERT_TRUE(server.Start().ok());
  auto stub = Client(server.grpc_port());
  std::unique_ptr<FixturePacker> second;
  double received_before = -1;
  for (uint64_t step = 0; step < kSteps; ++step) {
    if (step == 4) {
      // The packer dies mid-stream, after sending step kDiesAt - 1 (the stager
      // holds plans a few steps ahead, not all of them), and comes back on
      // the same address.
      env.packer_server->Shutdown(std::chrono::system_clock::now());
      env.packer_server.reset();
      // Plans sent before the packer died may still be on their way in.
      const absl::Time give_up = absl::Now() + absl::Seconds(20);
      do {
        received_before = MetricValue(HttpGet(server.metrics_port(), "/metrics"),
                                      "tutti_stager_plans_received_total");
        if (received_before >= kDiesAt) break;
        absl::SleepFor(absl::Milliseconds(20));
      } while (absl::Now() < give_up);
      ASSERT_EQ(received_before, kDiesAt);
      second = std::make_unique<FixturePacker>(env.data, env.job, kSteps);
      auto s = StartGrpcServer("127.0.0.1:" + std::to_string(port), {second.get()}, &env.packer_port);
      ASSERT_TRUE(s.ok()) << s.status();
      env.packer_server = std::move(*s);
    }
    for (uint32_t rank : {0u, 1u}) {
      v1::BatchDescriptor d;
      grpc::Status s = Acquire(*stub, step, rank, 30000, &d);
      ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.error_message();
      EXPECT_EQ(d.step(), step);
      // The batch is the one the (deterministic) plan names.
      const v1::StepPlan want = testing::MakePlan(env.data, env.job, step, {rank}, 2);
      EXPECT_EQ(d.plan().encoders(0).images(0).sample_id(),
                want.ranks(0).encoders(0).images(0).sample_id());
      grpc::ClientContext ctx;
      v1::ReleaseBatchRequest rel;
      rel.set_step(step);
      rel.set_rank(rank);
      v1::ReleaseBatchResponse resp;
      ASSERT_TRUE(stub->ReleaseBatch(&ctx, rel, &resp).ok());
    }
  }
  // The restarted packer was asked to resume exactly at the first step the
  // stager did not have; every step arrived once.
  ASSERT_FALSE(second->starts().empty());
  EXPECT_EQ(second->starts().front(), static_cast<uint64_t>(received_before));
  const std::string page = HttpGet(server.metrics_port(), "/metrics");
  EXPECT_EQ(MetricValue(page, "tutti_stager_plans_received_total"), kSteps);
  EXPECT_GE(MetricValue(page, "tutti_stager_packer_reconnects_total"), 1);
  server.Shutdown();
}

TEST(StagerDaemonTest, AsksThePackerOnlyForThePlansItsWindowHolds) {
  // An endless job: a stager that read the plan stream eagerly would make the
  // packer write (and plan) thousands of steps ahead of the clients.
  Env env("bounded", /*end_step=*/1000000);
  env.StartPacker();
  StagerServerOptions o = env.Options();  // window 2, stage_ahead 2
  StagerServer server(o);
  ASSERT_TRUE(server.Start().ok());
  auto stub = Client(server.grpc_port());
  const uint64_t kSteps = 6;
  const uint64_t ahead = o.core.window + o.core.stage_ahead;
  for (uint64_t step = 0; step < kSteps; ++step) {
    for (uint32_t rank : {0u, 1u}) {
      v1::BatchDescriptor d;
      grpc::Status s = Acquire(*stub, step, rank, 20000, &d);
      ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.error_message();
      grpc::ClientContext ctx;
      v1::ReleaseBatchRequest rel;
      rel.set_step(step);
      rel.set_rank(rank);
      v1::ReleaseBatchResponse resp;
      ASSERT_TRUE(stub->ReleaseBatch(&ctx, rel, &resp).ok());
    }
    // Never more than the window and stage_ahead beyond the oldest step held.
    absl::SleepFor(absl::Milliseconds(50));
    auto [written, highest] = env.packer->written();
    EXPECT_LE(highest, step + ahead) << "after step " << step;
    EXPECT_LE(written, step + 1 + ahead) << "after step " << step;
  }
  // Every plan the clients used came once.
  const std::string page = HttpGet(server.metrics_port(), "/metrics");
  EXPECT_EQ(MetricValue(page, "tutti_stager_plans_received_total"), env.packer->written().first);
  EXPECT_EQ(MetricValue(page, "tutti_stager_packer_reconnects_total"), 0);
  server.Shutdown();
}

TEST(StagerDaemonTest, TwoDaemonsWithTheSameJobIdKeepTheirOwnSegments) {
  // Two jobs with the same id (or two test runs) on one host, each stager
  // serving node 0 from its own cache.
  Env env("twins");
  env.StartPacker();
  StagerServerOptions oa = env.Options(), ob = env.Options();
  oa.core.cache_dir = env.root + "/cache_a";
  ob.core.cache_dir = env.root + "/cache_b";
  StagerServer a(oa), b(ob);
  ASSERT_TRUE(a.Start().ok());
  ASSERT_TRUE(b.Start().ok());
  v1::BatchDescriptor da, db;
  ASSERT_TRUE(Acquire(*Client(a.grpc_port()), 0, 0, 20000, &da).ok());
  ASSERT_TRUE(Acquire(*Client(b.grpc_port()), 0, 0, 20000, &db).ok());
  EXPECT_NE(da.shm_name(), db.shm_name());
  auto sa = ShmSegment::Open(da.shm_name(), false);
  auto sb = ShmSegment::Open(db.shm_name(), false);
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_EQ((*sa)->size(), da.shm_size());
  EXPECT_EQ((*sb)->size(), db.shm_size());
  // One stopping (or releasing) removes only its own batches.
  a.Shutdown();
  EXPECT_FALSE(fs::exists("/dev/shm" + da.shm_name()));
  EXPECT_TRUE(fs::exists("/dev/shm" + db.shm_name()));
  v1::BatchDescriptor again;
  ASSERT_TRUE(Acquire(*Client(b.grpc_port()), 1, 0, 20000, &again).ok());
  EXPECT_TRUE(ShmSegment::Open(again.shm_name(), false).ok());
  b.Shutdown();
  EXPECT_FALSE(fs::exists("/dev/shm" + db.shm_name()));
}

// Rank processes that die holding a batch, over the daemon's gRPC service:
// each process registers (the stager issues its incarnation and key) and a
// dead one simply stops calling. (1) Both ranks die holding step 3 and the
// job restarts from its checkpoint at step 2, one rank after the other; (2)
// rank 0 alone dies holding step 3 and comes back at step 4. The daemon is
// never restarted.
TEST(StagerDaemonTest, RanksThatDieHoldingABatchAreServedAgainWhenTheyRestart) {
  Env env("incarnations", 40);
  env.StartPacker();
  StagerServer server(env.Options());
  ASSERT_TRUE(server.Start().ok());
  const int port = server.grpc_port();
  auto stub = Client(port);
  auto step_of = [&](uint64_t step, uint32_t rank, const Process& p, bool release) {
    v1::BatchDescriptor d;
    grpc::Status s = Acquire(*stub, step, rank, 30000, &d, p);
    EXPECT_TRUE(s.ok()) << "step " << step << " rank " << rank << ": " << s.error_message();
    EXPECT_EQ(d.step(), step);
    if (release && s.ok()) {
      grpc::Status r = Release(*stub, step, rank, p);
      EXPECT_TRUE(r.ok()) << r.error_message();
    }
    return s.ok();
  };
  const Process a[2] = {Register(port, 0), Register(port, 1)};
  for (uint64_t step = 0; step < 3; ++step) {
    for (uint32_t rank : {0u, 1u}) ASSERT_TRUE(step_of(step, rank, a[rank], true));
  }
  for (uint32_t rank : {0u, 1u}) ASSERT_TRUE(step_of(3, rank, a[rank], false));  // both die

  // (1) Resumed at step 2: rank 0's new process asks first, while rank 1's
  // dead one still holds step 3; then rank 1's new process registers.
  const Process b0 = Register(port, 0);
  v1::BatchDescriptor first;
  grpc::Status first_status;
  std::thread rank0([&] { first_status = Acquire(*stub, 2, 0, 30000, &first, b0); });
  absl::SleepFor(absl::Milliseconds(200));
  const Process b1 = Register(port, 1);
  ASSERT_TRUE(step_of(2, 1, b1, true));
  rank0.join();
  ASSERT_TRUE(first_status.ok()) << first_status.error_message();
  EXPECT_EQ(first.step(), 2u);
  // The dead processes' calls are refused, and cannot release what the new ones hold.
  EXPECT_EQ(Release(*stub, 2, 0, a[0]).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(Release(*stub, 2, 0, b0).ok());
  const Process b[2] = {b0, b1};
  for (uint32_t rank : {0u, 1u}) ASSERT_TRUE(step_of(3, rank, b[rank], rank == 1));

  // (2) Rank 0 dies holding step 3 and restarts alone at step 4; both go on
  // well past where the window used to stall.
  const Process c0 = Register(port, 0);
  for (uint64_t step = 4; step < 12; ++step) {
    for (uint32_t rank : {0u, 1u}) ASSERT_TRUE(step_of(step, rank, rank == 0 ? c0 : b1, true));
  }
  server.Shutdown();
}

TEST(StagerDaemonTest, StepThePackerCannotServeIsPassedThrough) {
  Env env("end", /*end_step=*/2);
  env.StartPacker();
  StagerServer server(env.Options());
  ASSERT_TRUE(server.Start().ok());
  auto stub = Client(server.grpc_port());
  v1::BatchDescriptor d;
  ASSERT_TRUE(Acquire(*stub, 0, 0, 20000, &d).ok());
  grpc::Status s = Acquire(*stub, 2, 0, 5000, &d);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
  EXPECT_NE(s.error_message().find("packer cannot serve step 2"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("past the end of the dataset"), std::string::npos);
}

TEST(StagerDaemonTest, WaitsForAPackerThatStartsLate) {
  Env env("late");
  // Reserve a port for the packer, then start it after the stager.
  int port = 0;
  {
    FixturePacker other(env.data, env.job, 1);
    auto probe = StartGrpcServer("127.0.0.1:0", {&other}, &port);
    ASSERT_TRUE(probe.ok());
    (*probe)->Shutdown();
  }
  env.packer_port = port;
  StagerServer server(env.Options());
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(700));
    env.StartPacker(port);
  });
  absl::Status s = server.Start();
  later.join();
  ASSERT_TRUE(s.ok()) << s;
  v1::BatchDescriptor d;
  EXPECT_TRUE(Acquire(*Client(server.grpc_port()), 0, 1, 20000, &d).ok());
}

TEST(StagerDaemonTest, PortInUseIsAClearError) {
  Env env("port");
  env.StartPacker();
  StagerServer a(env.Options());
  ASSERT_TRUE(a.Start().ok());
  StagerServerOptions o = env.Options();
  o.listen = "127.0.0.1:" + std::to_string(a.grpc_port());
  o.core.cache_dir = env.root + "/cache2";
  StagerServer b(o);
  absl::Status s = b.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find(std::to_string(a.grpc_port())), std::string::npos) << s;
  StagerServerOptions m = env.Options();
  m.metrics = "127.0.0.1:" + std::to_string(a.metrics_port());
  m.core.cache_dir = env.root + "/cache3";
  StagerServer c(m);
  absl::Status sm = c.Start();
  EXPECT_EQ(sm.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(sm.message().find("--metrics"), std::string::npos) << sm;
}

TEST(StagerDaemonTest, NodeAutoLearnsTheNodeFromTheFirstClient) {
  Env env("auto");
  env.StartPacker();
  StagerServerOptions o = env.Options();
  o.core.node = 0;
  o.core.node_auto = true;  // a DaemonSet: the node is not known up front
  StagerServer server(o);
  ASSERT_TRUE(server.Start().ok());
  auto stub = Client(server.grpc_port());
  v1::BatchDescriptor d;
  grpc::Status first = Acquire(*stub, 0, 3, 20000, &d);  // rank 3: node 1 of 2-rank nodes
  ASSERT_TRUE(first.ok()) << first.error_message();
  EXPECT_EQ(d.plan().rank(), 3u);
  EXPECT_NE(d.shm_name().find("-n1-r3-s0"), std::string::npos) << d.shm_name();
  ASSERT_TRUE(Acquire(*stub, 0, 2, 20000, &d).ok());
  grpc::Status other = Acquire(*stub, 0, 0, 1000, &d);
  EXPECT_EQ(other.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(other.error_message().find("rank 0 belongs to node 0 but this tutti-stagerd serves node 1"),
            std::string::npos)
      << other.error_message();
  EXPECT_NE(other.error_message().find("learned from rank 3"), std::string::npos) << other.error_message();
  grpc::Status outside = Acquire(*stub, 0, 9, 1000, &d);
  EXPECT_EQ(outside.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  server.Shutdown();
}

TEST(StagerDaemonTest, ServesOnAUnixSocket) {
  Env env("unix");
  env.StartPacker();
  StagerServerOptions o = env.Options();
  const std::string sock = env.root + "/stager.sock";
  o.listen = "unix://" + sock;
  StagerServer server(o);
  ASSERT_TRUE(server.Start().ok());
  EXPECT_EQ(server.grpc_address(), "unix://" + sock);
  auto stub = v1::Stager::NewStub(MakeChannel("unix://" + sock));
  v1::BatchDescriptor d;
  grpc::Status s = Acquire(*stub, 0, 1, 20000, &d);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(d.plan().rank(), 1u);
  // A second daemon on the same live socket is refused, naming it.
  StagerServerOptions o2 = o;
  o2.core.cache_dir = env.root + "/cache2";
  StagerServer second(o2);
  absl::Status busy = second.Start();
  EXPECT_EQ(busy.code(), absl::StatusCode::kUnavailable) << busy;
  EXPECT_NE(busy.message().find(sock), std::string::npos) << busy;
  server.Shutdown();
  // A socket file left behind by a daemon that is gone is taken over.
  StagerServer third(o2);
  ASSERT_TRUE(third.Start().ok());
  auto stub3 = v1::Stager::NewStub(MakeChannel("unix://" + sock));
  EXPECT_TRUE(Acquire(*stub3, 0, 0, 20000, &d).ok());
  third.Shutdown();
}

// Starts tutti-stagerd as a child process for env's job with `extra` flags
// (--listen, --node, ...) and waits up to 30 s for its port file to name
// the gRPC port (it names the metrics port alone while starting), whose
// text goes to *ports. The child's pid, or -1 (with a failure recorded) when
// it did not write the file.
pid_t StartStagerd(const Env& env, const std::vector<std::string>& extra, std::string* ports) {
  const std::string port_file = env.root + "/ports";
  std::vector<std::string> args = {"tutti-stagerd",
                                   "--packer=127.0.0.1:" + std::to_string(env.packer_port),
                                   "--source=" + env.data.dir,
                                   "--cache=" + env.root + "/cache",
                                   "--port_file=" + port_file,
                                   "--metrics=127.0.0.1:0",
                                   "--window=2",
                                   "--queue_depth=8",
                                   "--decode_threads=1"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execv(TUTTI_STAGERD_BINARY, argv.data());
    ::_exit(127);
  }
  if (pid < 0) {
    ADD_FAILURE() << "fork failed";
    return -1;
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  auto text = ReadFileToString(port_file);
  while ((!text.ok() || text->find("grpc=") == std::string::npos) && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
    text = ReadFileToString(port_file);
  }
  if (!text.ok() || text->find("grpc=") == std::string::npos) {
    ADD_FAILURE() << "tutti-stagerd wrote no port file " << port_file << ": " << text.status();
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return -1;
  }
  *ports = *text;
  return pid;
}

TEST(StagerDaemonTest, DaemonWithNodeAutoOnAUnixSocket) {
  Env env("auto_unix");
  env.StartPacker();
  const std::string sock = env.root + "/d.sock";
  std::string ports;
  const pid_t pid = StartStagerd(env, {"--listen=unix://" + sock, "--node=auto"}, &ports);
  ASSERT_GT(pid, 0);
  EXPECT_NE(ports.find("grpc_address=unix://" + sock), std::string::npos) << ports;
  auto stub = v1::Stager::NewStub(MakeChannel("unix://" + sock));
  v1::BatchDescriptor d;
  grpc::Status s = Acquire(*stub, 0, 2, 20000, &d);
  EXPECT_TRUE(s.ok()) << s.error_message();
  grpc::Status other = Acquire(*stub, 0, 1, 1000, &d);
  EXPECT_EQ(other.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(other.error_message().find("belongs to node 0"), std::string::npos);
  EXPECT_NE(other.error_message().find("serves node 1"), std::string::npos);
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(StagerDaemonTest, DaemonShutsDownCleanlyOnSigterm) {
  Env env("sigterm");
  env.StartPacker();
  std::string ports;
  const pid_t pid = StartStagerd(env, {"--listen=127.0.0.1:0"}, &ports);
  ASSERT_GT(pid, 0);
  const int grpc_port = std::stoi(ports.substr(ports.find("grpc=") + 5));
  v1::BatchDescriptor d;
  ASSERT_TRUE(Acquire(*Client(grpc_port), 0, 0, 20000, &d).ok());
  const std::string shm = "/dev/shm" + d.shm_name();
  EXPECT_TRUE(fs::exists(shm));
  const absl::Time term = absl::Now();
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  // Nothing in the shutdown waits on a poll interval (the /metrics listener
  // alone used to take up to 2 s).
  EXPECT_LT(absl::Now() - term, absl::Milliseconds(1500));
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(fs::exists(shm));
}

// Runs the unprivileged client helper as `uid` with primary group `gid` and
// supplementary `groups`; its exit status and output.
std::pair<int, std::string> RunClientAs(uint32_t uid, uint32_t gid, const std::string& groups,
                                        const std::string& stager, int packer_port) {
  const std::string out = ::testing::TempDir() + "/unprivileged_" + std::to_string(::getpid()) +
                          "_" + std::to_string(uid) + "_" + groups;
  const std::string cmd = absl::StrCat(
      TUTTI_UNPRIVILEGED_CLIENT, " --uid=", uid, " --gid=", gid, " --groups=", groups,
      " --stager=", stager, " --packer=127.0.0.1:", packer_port, " --rank=0 --world_size=4 >",
      out, " 2>&1");
  const int status = std::system(cmd.c_str());
  auto text = ReadFileToString(out);
  fs::remove(out);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text.ok() ? *text : ""};
}

TEST(StagerDaemonTest, AnUnprivilegedClientInTheSocketGroupReadsBatches) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "this test creates an unprivileged user and group, which needs root; "
                    "run it as root to check --socket_group";
  }
  // A user and a group of their own (numeric, as in a container: no
  // /etc/passwd entry is needed), nothing else of the daemon's.
  const uint32_t group = 40000 + static_cast<uint32_t>(::getpid() % 20000);
  const uint32_t user = group, other_group = group + 1;
  Env env("group");
  env.StartPacker();
  const std::string dir = env.root + "/sock";
  fs::create_directories(dir);
  for (const std::string& d : {::testing::TempDir(), env.root, dir}) ::chmod(d.c_str(), 0755);
  const std::string sock = dir + "/stager.sock";
  std::string ports;
  const pid_t pid = StartStagerd(
      env, {"--listen=unix://" + sock, "--socket_group=" + std::to_string(group)}, &ports);
  ASSERT_GT(pid, 0);
  struct stat st{};
  ASSERT_EQ(::stat(sock.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, group);
  // In the group (as a supplementary group, like a pod's supplementalGroups):
  // connects, takes a batch, reads every byte of its segment.
  auto [code, out] = RunClientAs(user, other_group, std::to_string(group), "unix://" + sock,
                                 env.packer_port);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("ok step=0"), std::string::npos) << out;
  EXPECT_NE(out.find(absl::StrCat("segment_mode=640 segment_gid=", group)), std::string::npos)
      << out;
  // Not in the group: refused at the socket.
  auto [refused, why] = RunClientAs(user, other_group, "", "unix://" + sock, env.packer_port);
  EXPECT_NE(refused, 0) << why;
  EXPECT_NE(why.find("ermission denied"), std::string::npos) << why;
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace tutti::stager
