// The lifecycle both daemons share, on the real binaries: readiness on
// /readyz and the standard gRPC health service (false while the packer
// loads its index or the stager cannot reach the packer, true after), SIGTERM
// at any moment (also during those waits) ending with exit 0 within the
// documented bound, /metrics never held up by an idle connection, and bad
// usage refused with exit 2 naming the flag and its range.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/daemon.h"
#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/e2e_support.h"
#include "tests/mounts.h"
#include "tutti/v1/stager.grpc.pb.h"

namespace tutti::e2e {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using HealthResponse = grpc::health::v1::HealthCheckResponse;

// A dataset, its index and a job config, once for the whole suite.
class Lifecycle : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(MakeTempDir("lifecycle"));
    ASSERT_TRUE(GenerateDataset(*dir_ + "/src").ok());
    ASSERT_TRUE(BuildIndex(*dir_ + "/src", *dir_ + "/index.tutti").ok());
    std::ofstream(*dir_ + "/job.textproto") << JobConfigText(*dir_ + "/index.tutti", 1);
  }
  static void TearDownTestSuite() {
    RemoveTree(*dir_);
    delete dir_;
  }
  static std::string Dir() { return *dir_; }

  // A daemon started without waiting for it to serve.
  struct Started {
    std::unique_ptr<Process> process;
    std::string port_file;
  };
  static Started Launch(const std::string& name, std::vector<std::string> argv) {
    Started s;
    s.port_file = Dir() + "/" + name + ".ports";
    fs::remove(s.port_file);
    argv.push_back("--port_file=" + s.port_file);
    auto p = Process::Start(argv, Dir() + "/" + name + ".log");
    EXPECT_TRUE(p.ok()) << p.status();
    if (p.ok()) s.process = std::move(*p);
    return s;
  }
  // The metrics port once the port file names it (the operational endpoints
  // serve before the daemon does); 0 when it never does.
  static int MetricsPort(const Started& s) {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (absl::Now() < give_up && s.process->Running()) {
      const std::string text = ReadFileOrEmpty(s.port_file);
      const size_t at = text.find("metrics=");
      if (at != std::string::npos) return std::atoi(text.c_str() + at + 8);
      absl::SleepFor(absl::Milliseconds(20));
    }
    return 0;
  }
  // Waits (generously) until /readyz answers 200, or until `ready` is false
  // and it answers 503 containing `reason`.
  static absl::Status AwaitReadiness(int metrics_port, bool ready, const std::string& reason = "",
                                     absl::Duration timeout = absl::Seconds(60)) {
    const absl::Time give_up = absl::Now() + timeout;
    absl::StatusOr<std::string> last;
    while (absl::Now() < give_up) {
      last = HttpGet(metrics_port, "/readyz");
      if (ready && last.ok() && *last == "ready\n") return absl::OkStatus();
      if (!ready && !last.ok() && absl::IsUnavailable(last.status()) &&
          last.status().message().find(" 503 ") != std::string::npos &&
          last.status().message().find(reason) != std::string::npos) {
        return absl::OkStatus();
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "/readyz did not become ", ready ? "ready" : "not ready", ": last answer ",
        last.ok() ? *last : std::string(last.status().message())));
  }
  static HealthResponse::ServingStatus Health(int grpc_port, const std::string& service,
                                              grpc::StatusCode* code = nullptr) {
    auto stub = grpc::health::v1::Health::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", grpc_port)));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    HealthResponse resp;
    const grpc::Status s = stub->Check(&ctx, req, &resp);
    if (code != nullptr) *code = s.error_code();
    return s.ok() ? resp.status() : HealthResponse::UNKNOWN;
  }
  // SIGTERM, then the exit status within the documented bound (nullopt: still running).
  static std::optional<int> Terminate(Process& p) {
    p.Signal(SIGTERM);
    return p.Wait(kStopBound);
  }
  std::vector<std::string> PackerArgv(const std::string& listen = "127.0.0.1:0") {
    return {Packerd(), "--config=" + Dir() + "/job.textproto", "--listen=" + listen,
            "--metrics=127.0.0.1:0"};
  }
  std::vector<std::string> StagerArgv(int packer_port, const std::string& cache) {
    return {Stagerd(),
            absl::StrCat("--packer=127.0.0.1:", packer_port),
            "--node=0",
            "--source=" + Dir() + "/src",
            "--cache=" + Dir() + "/" + cache,
            "--listen=127.0.0.1:0",
            "--metrics=127.0.0.1:0",
            "--decode_threads=1",
            "--memory_budget=256M",
            "--packer_wait_s=600"};
  }

  // A packer and a stager of node 0 serving it, both named after `name`;
  // `source` replaces the stager's --source when set. Null when one did not start.
  struct Both {
    std::unique_ptr<Daemon> packer, stager;
  };
  Both StartBoth(const std::string& name, const std::string& source = "") {
    Both b;
    auto packer = Daemon::Start(name + "-packer", PackerArgv(), Dir());
    EXPECT_TRUE(packer.ok()) << packer.status();
    if (!packer.ok()) return b;
    b.packer = std::move(*packer);
    std::vector<std::string> argv = StagerArgv(b.packer->grpc_port(), "cache-" + name);
    for (auto& a : argv) {
      if (!source.empty() && a.rfind("--source=", 0) == 0) a = "--source=" + source;
    }
    auto stager = Daemon::Start(name + "-stager", argv, Dir());
    EXPECT_TRUE(stager.ok()) << stager.status();
    if (stager.ok()) b.stager = std::move(*stager);
    return b;
  }

  static std::string* dir_;
};
std::string* Lifecycle::dir_ = nullptr;

using ::tutti::mounts::Mounted;

TEST_F(Lifecycle, PackerIsNotReadyWhileItLoadsAndStopsOnSigtermThen) {
#ifndef TUTTI_SLOWFS_BINARY
  GTEST_SKIP() << "built without tutti-slowfs (FUSE)";
#else
  // A config whose reads never complete (tutti-slowfs stalling it, as a hung
  // network file system would): the packer is stuck before its index loads.
  // (A FIFO would not do: the packer refuses one at once.)
  if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "/dev/fuse is not available";
  const std::string src = Dir() + "/stuck-src";
  const std::string mnt = fs::path(Dir() + "/stuck-mnt").lexically_normal().string();
  fs::create_directories(src);
  fs::create_directories(mnt);
  fs::copy_file(Dir() + "/job.textproto", src + "/job.textproto",
                fs::copy_options::overwrite_existing);
  auto fuse = Process::Start(
      {TUTTI_SLOWFS_BINARY, src, mnt, "--latency_ms=1", "--stall=job.textproto"},
      Dir() + "/stuck-slowfs.log");
  ASSERT_TRUE(fuse.ok()) << fuse.status();
  for (int i = 0; i < 250 && !Mounted(mnt) && (*fuse)->Running(); ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (!Mounted(mnt)) GTEST_SKIP() << "could not mount tutti-slowfs: " << (*fuse)->log();
  Started s = Launch("stuck-packer", {Packerd(), "--config=" + mnt + "/job.textproto",
                                      "--listen=127.0.0.1:0", "--metrics=127.0.0.1:0"});
  const int metrics = MetricsPort(s);
  EXPECT_GT(metrics, 0) << s.process->log();
  if (metrics > 0) {
    EXPECT_TRUE(AwaitReadiness(metrics, false, "index: loading").ok());
    EXPECT_TRUE(HttpGet(metrics, "/healthz").ok());  // alive all the same
    const std::optional<int> status = Terminate(*s.process);
    EXPECT_TRUE(status.has_value()) << "still running " << absl::FormatDuration(kStopBound)
                                    << " after SIGTERM\n" << s.process->log();
    if (status.has_value()) EXPECT_EQ(*status, 0) << s.process->log();
  }
  (*fuse)->Signal(SIGTERM);  // unmounts (stalled reads fail with EIO)
  if (!(*fuse)->Wait(absl::Seconds(20)).has_value()) {
    RunCommand({"fusermount3", "-u", "-z", mnt}, absl::Seconds(10));
  }
#endif
}

// A stager with one shard on a source that stops answering (tutti-slowfs
// stalling its every read: staging reads and member reads stuck in the
// kernel, with io_uring and with pread) ends on SIGTERM at once with exit 0:
// stopping does not wait on the stalled reads (their buffers are kept, never
// freed under the kernel).
TEST_F(Lifecycle, StagerStopsPromptlyWithReadsStalledInFlight) {
#ifndef TUTTI_SLOWFS_BINARY
  GTEST_SKIP() << "built without tutti-slowfs (FUSE)";
#else
  if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "/dev/fuse is not available";
  for (const char* backend : {"uring", "pread"}) {
    SCOPED_TRACE(backend);
    const std::string mnt = fs::path(Dir() + "/stalled-mnt-" + backend).lexically_normal().string();
    fs::create_directories(mnt);
    std::string stalled;  // the first shard the index names
    for (const auto& e : fs::directory_iterator(Dir() + "/src")) {
      const std::string n = e.path().filename().string();
      if (e.path().extension() == ".tar" && (stalled.empty() || n < stalled)) stalled = n;
    }
    auto fuse = Process::Start(
        {TUTTI_SLOWFS_BINARY, Dir() + "/src", mnt, "--latency_ms=1", "--stall=" + stalled},
        Dir() + "/stalled-slowfs-" + backend + ".log");
    ASSERT_TRUE(fuse.ok()) << fuse.status();
    for (int i = 0; i < 250 && !Mounted(mnt) && (*fuse)->Running(); ++i) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (!Mounted(mnt)) GTEST_SKIP() << "could not mount tutti-slowfs: " << (*fuse)->log();
    const std::string name = std::string("stalled-") + backend;
    auto packer = Daemon::Start(name + "-packer", PackerArgv(), Dir());
    ASSERT_TRUE(packer.ok()) << packer.status();
    std::vector<std::string> argv = StagerArgv((*packer)->grpc_port(), "cache-" + name);
    for (auto& a : argv) {
      if (a.rfind("--source=", 0) == 0) a = "--source=" + mnt;
    }
    argv.push_back(std::string("--io_backend=") + backend);
    auto stager = Daemon::Start(name + "-stager", argv, Dir());
    ASSERT_TRUE(stager.ok()) << stager.status();
    // A rank waits for step 0, whose members are read from the source
    // (nothing stages), while staging reads stall.
    std::thread rank([address = (*stager)->address()] {
      auto stub = v1::Stager::NewStub(MakeChannel(address));
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      v1::AcquireBatchRequest req;
      req.set_step(0);
      req.set_rank(0);
      req.set_timeout_ms(20000);
      v1::BatchDescriptor batch;
      stub->AcquireBatch(&ctx, req, &batch);
    });
    absl::SleepFor(absl::Seconds(3));
    const absl::Time signalled = absl::Now();
    (*stager)->process().Signal(SIGTERM);
    const std::optional<int> status = (*stager)->process().Wait(kStopBound);
    rank.join();
    ASSERT_TRUE(status.has_value())
        << "still running " << absl::FormatDuration(kStopBound) << " after SIGTERM\n"
        << (*stager)->log();
    EXPECT_EQ(*status, 0) << (*stager)->log();
    EXPECT_LT(absl::Now() - signalled, absl::Seconds(5)) << (*stager)->log();
    EXPECT_TRUE((*packer)->Stop().ok());
    (*fuse)->Signal(SIGTERM);  // unmounts (stalled reads fail with EIO)
    if (!(*fuse)->Wait(absl::Seconds(20)).has_value()) {
      RunCommand({"fusermount3", "-u", "-z", mnt}, absl::Seconds(10));
    }
  }
#endif
}

// A FIFO given as the config is refused at once, naming it (it would block
// the packer's open for as long as nobody writes it).
TEST_F(Lifecycle, PackerRefusesAFifoAsItsConfigAtOnce) {
  const std::string fifo = Dir() + "/fifo-config";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  RunResult r = RunCommand({Packerd(), "--config=" + fifo, "--listen=127.0.0.1:0",
                            "--metrics=127.0.0.1:0"},
                           absl::Seconds(30));
  EXPECT_FALSE(r.timed_out) << "blocked opening the FIFO";
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(fifo + " is not a regular file (a FIFO)")) << r.output;
}

TEST_F(Lifecycle, PackerIsReadyOnceItsIndexIsLoadedAndItsFirstPlanComputed) {
  auto d = Daemon::Start("packer", PackerArgv(), Dir());
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(AwaitReadiness((*d)->metrics_port(), true).ok());
  EXPECT_EQ(Health((*d)->grpc_port(), ""), HealthResponse::SERVING);
  EXPECT_EQ(Health((*d)->grpc_port(), "tutti.v1.Packer"), HealthResponse::SERVING);
  grpc::StatusCode code;
  Health((*d)->grpc_port(), "tutti.v1.Stager", &code);
  EXPECT_EQ(code, grpc::StatusCode::NOT_FOUND);
  auto metrics = HttpGet((*d)->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  for (const char* name : {"tutti_build_info{commit=", "process_cpu_seconds_total ",
                           "process_resident_memory_bytes ", "process_open_fds ",
                           "process_start_time_seconds ", "tutti_packer_"}) {
    EXPECT_THAT(*metrics, HasSubstr(name));
  }
  EXPECT_TRUE((*d)->Stop().ok());
}

TEST_F(Lifecycle, StagerIsReadyOnlyWhileThePackerAnswersAndStopsDuringItsWait) {
  const int packer_port = FreeLoopbackPort();
  Started s = Launch("waiting-stager", StagerArgv(packer_port, "cache-wait"));
  const int metrics = MetricsPort(s);
  ASSERT_GT(metrics, 0) << s.process->log();
  ASSERT_TRUE(AwaitReadiness(metrics, false, "packer: waiting for the packer").ok());
  // SIGTERM while it waits for the packer (--packer_wait_s 600): exit 0 within the bound.
  const std::optional<int> status = Terminate(*s.process);
  ASSERT_TRUE(status.has_value()) << "still running " << absl::FormatDuration(kStopBound)
                                  << " after SIGTERM\n" << s.process->log();
  EXPECT_EQ(*status, 0) << s.process->log();

  // Again, and this time the packer comes.
  Started t = Launch("late-stager", StagerArgv(packer_port, "cache-late"));
  const int metrics2 = MetricsPort(t);
  ASSERT_GT(metrics2, 0) << t.process->log();
  ASSERT_TRUE(AwaitReadiness(metrics2, false, "packer: waiting for the packer").ok());
  auto packer = Daemon::Start("late-packer", PackerArgv(absl::StrCat("127.0.0.1:", packer_port)),
                              Dir());
  ASSERT_TRUE(packer.ok()) << packer.status();
  ASSERT_TRUE(AwaitReadiness(metrics2, true).ok()) << t.process->log();
  // Ready means serving: the port file names the gRPC port by then.
  const std::string ports = ReadFileOrEmpty(t.port_file);
  ASSERT_EQ(ports.rfind("grpc=", 0), 0u) << ports;
  const int grpc = std::atoi(ports.c_str() + 5);
  EXPECT_EQ(Health(grpc, "tutti.v1.Stager"), HealthResponse::SERVING);
  // The packer goes away: the stager stops being ready, and is again once it is back.
  ASSERT_TRUE((*packer)->Stop().ok());
  EXPECT_TRUE(AwaitReadiness(metrics2, false, "packer: the packer at").ok());
  EXPECT_EQ(Health(grpc, "tutti.v1.Stager"), HealthResponse::NOT_SERVING);
  auto again = Daemon::Start("again-packer", PackerArgv(absl::StrCat("127.0.0.1:", packer_port)),
                             Dir());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(AwaitReadiness(metrics2, true).ok());
  const std::optional<int> end = Terminate(*t.process);
  ASSERT_TRUE(end.has_value()) << t.process->log();
  EXPECT_EQ(*end, 0) << t.process->log();
  EXPECT_TRUE((*again)->Stop().ok());
}

TEST_F(Lifecycle, StagerIsNotReadyWhileItsSourceOrItsCacheIsGone) {
  // The source through a link that can vanish (an NFS mount going away).
  const std::string source = Dir() + "/src-link";
  fs::create_directory_symlink(Dir() + "/src", source);
  Both d = StartBoth("gone", source);
  ASSERT_TRUE(d.stager != nullptr);
  Daemon* stager = d.stager.get();
  const int metrics = stager->metrics_port();
  ASSERT_TRUE(AwaitReadiness(metrics, true).ok()) << stager->log();

  fs::remove(source);
  EXPECT_TRUE(AwaitReadiness(metrics, false, "source: --source " + source + " is not reachable")
                  .ok());
  EXPECT_EQ(Health(stager->grpc_port(), "tutti.v1.Stager"), HealthResponse::NOT_SERVING);
  fs::create_directory_symlink(Dir() + "/src", source);
  EXPECT_TRUE(AwaitReadiness(metrics, true).ok());

  // The cache directory moved away, then another one put in its place.
  const std::string cache = Dir() + "/cache-gone", moved = cache + ".moved";
  fs::rename(cache, moved);
  EXPECT_TRUE(AwaitReadiness(metrics, false, "cache: --cache " + cache + " is not reachable").ok());
  fs::create_directory(cache);
  EXPECT_TRUE(AwaitReadiness(metrics, false, "is another directory than the one this daemon opened")
                  .ok());
  fs::remove(cache);
  fs::rename(moved, cache);
  EXPECT_TRUE(AwaitReadiness(metrics, true).ok());
  EXPECT_EQ(Health(stager->grpc_port(), "tutti.v1.Stager"), HealthResponse::SERVING);
  EXPECT_TRUE(stager->Stop().ok());
  EXPECT_TRUE(d.packer->Stop().ok());
}

TEST_F(Lifecycle, JsonLogsAreOneObjectPerLineGrpcsOwnIncluded) {
  // gRPC as talkative as it gets: its lines must come through common/log.h too.
  const std::vector<std::string> env = {"GRPC_VERBOSITY=DEBUG", "GRPC_TRACE=api"};
  for (const bool stager : {false, true}) {
    const std::string name = stager ? "json-stager" : "json-packer";
    const std::string port_file = Dir() + "/" + name + ".ports";
    std::vector<std::string> argv =
        stager ? StagerArgv(FreeLoopbackPort(), "cache-json") : PackerArgv();
    argv.push_back("--log_format=json");
    argv.push_back("--port_file=" + port_file);
    auto p = Process::Start(argv, Dir() + "/" + name + ".log", env);
    ASSERT_TRUE(p.ok()) << p.status();
    // The packer serves; the stager waits for a packer that is not there.
    const std::string want = stager ? "metrics=" : "grpc=";
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (absl::Now() < give_up && ReadFileOrEmpty(port_file).find(want) == std::string::npos) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    absl::SleepFor(absl::Milliseconds(300));
    const std::optional<int> status = Terminate(**p);
    ASSERT_TRUE(status.has_value()) << (*p)->log();
    EXPECT_EQ(*status, 0) << (*p)->log();
    const std::string log = (*p)->log();
    int lines = 0, grpc = 0;
    for (absl::string_view line : absl::StrSplit(log, '\n', absl::SkipEmpty())) {
      ++lines;
      EXPECT_THAT(std::string(line),
                  ::testing::MatchesRegex("\\{\"ts\":\"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{15}Z\","
                                          "\"level\":\"(debug|info|warning|error)\","
                                          "\"component\":\"[a-z.]+\",\"msg\":\".*\\}"))
          << name;
      grpc += absl::StrContains(line, "\"component\":\"grpc\"");
    }
    EXPECT_GT(lines, 3) << log;
    EXPECT_GT(grpc, 0) << name << ": no line of gRPC's own\n" << log;
  }
}

TEST_F(Lifecycle, AStopPassedOnTwiceStillEndsCleanly) {
  // Ctrl-C in a terminal reaches the whole process group, and the script
  // that started the daemons passes it on as SIGTERM a moment later; srun
  // and scancel do the same. One stop, exit 0, segments removed.
  Both both = StartBoth("twice");
  ASSERT_TRUE(both.stager != nullptr);
  auto stub = v1::Stager::NewStub(MakeChannel(both.stager->address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::AcquireBatchRequest req;
  req.set_step(0);
  req.set_rank(0);
  req.set_timeout_ms(50000);
  v1::BatchDescriptor batch;
  const grpc::Status acquired = stub->AcquireBatch(&ctx, req, &batch);
  ASSERT_TRUE(acquired.ok()) << acquired.error_message();
  const std::string segment = "/dev/shm" + batch.shm_name();
  ASSERT_TRUE(fs::exists(segment)) << segment;
  for (Daemon* d : {both.stager.get(), both.packer.get()}) {
    d->process().Signal(SIGINT);
    d->process().Signal(SIGTERM);
    const std::optional<int> status = d->process().Wait(kStopBound);
    ASSERT_TRUE(status.has_value()) << d->name() << " still running "
                                    << absl::FormatDuration(kStopBound) << " after the signals\n"
                                    << d->log();
    EXPECT_EQ(*status, 0) << d->name() << "\n" << d->log();
  }
  EXPECT_FALSE(fs::exists(segment)) << segment;
}

// SIGHUP (a closed terminal, an operator's reload) never ends a daemon: it
// is logged and ignored, serving goes on and SIGTERM still ends it with 0.
// The start-up banner is printed once in text logs (stdout and stderr in one
// log here, as a terminal, journald or kubectl logs show them).
TEST_F(Lifecycle, SighupIsLoggedAndIgnoredAndTheBannerIsPrintedOnce) {
  auto count = [](const std::string& log, const std::string& what) {
    size_t n = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++n;
    return n;
  };
  // Waits (generously) until `what` is in d's log `n` times.
  auto await = [&](Daemon* d, const std::string& what, size_t n) {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (absl::Now() < give_up && count(d->log(), what) < n && d->process().Running()) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    return count(d->log(), what);
  };
  Both both = StartBoth("hup");
  ASSERT_TRUE(both.stager != nullptr);
  for (Daemon* d : {both.packer.get(), both.stager.get()}) {
    ASSERT_TRUE(AwaitReadiness(d->metrics_port(), true).ok()) << d->name() << "\n" << d->log();
    EXPECT_EQ(await(d, " listening on ", 1), 1u) << d->name() << "\n" << d->log();
    for (size_t i = 1; i <= 2; ++i) {
      d->process().Signal(SIGHUP);
      EXPECT_EQ(await(d, "SIGHUP received and ignored", i), i) << d->name() << "\n" << d->log();
      ASSERT_TRUE(d->process().Running()) << d->name() << " died of SIGHUP\n" << d->log();
    }
    EXPECT_TRUE(AwaitReadiness(d->metrics_port(), true).ok()) << d->name();
    EXPECT_EQ(count(d->log(), " listening on "), 1u)
        << d->name() << ": the banner printed more than once\n"
        << d->log();
  }
  EXPECT_TRUE(both.stager->Stop().ok());
  EXPECT_TRUE(both.packer->Stop().ok());
}

TEST_F(Lifecycle, AnIdleConnectionNeverDelaysAScrapeOnEitherDaemon) {
  Both both = StartBoth("idle");
  ASSERT_TRUE(both.stager != nullptr);
  for (Daemon* d : {both.packer.get(), both.stager.get()}) {
    // Connections that send nothing (and one that stops mid-request) stay open.
    std::vector<int> idle;
    for (int i = 0; i < 8; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(d->metrics_port()));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
      idle.push_back(fd);
    }
    [[maybe_unused]] ssize_t w = ::write(idle.back(), "GET /met", 8);
    // Scrapes from several clients at once are all answered well before the
    // idle connections time out (10 s).
    std::atomic<int> answered{0};
    std::vector<std::thread> scrapers;
    std::vector<std::string> pages(4);
    for (int t = 0; t < 4; ++t) {
      scrapers.emplace_back([&, t] {
        auto m = HttpGet(d->metrics_port(), "/metrics", absl::Seconds(5));
        if (m.ok()) pages[t] = *m;
        answered += m.ok() && m->find("process_cpu_seconds_total") != std::string::npos;
      });
    }
    for (auto& t : scrapers) t.join();
    EXPECT_EQ(answered.load(), 4) << d->name();
    // Both daemons export the build and the process metrics.
    for (const char* name :
         {"tutti_build_info{commit=", "process_cpu_seconds_total ", "process_resident_memory_bytes ",
          "process_virtual_memory_bytes ", "process_open_fds ", "process_max_fds ",
          "process_start_time_seconds "}) {
      EXPECT_THAT(pages[0], HasSubstr(name)) << d->name();
    }
    for (int fd : idle) ::close(fd);
  }
  EXPECT_TRUE(both.stager->Stop().ok());
  EXPECT_TRUE(both.packer->Stop().ok());
}

TEST_F(Lifecycle, BadUsageExitsTwoNamingTheFlagAndItsRange) {
  const std::vector<std::string> base = StagerArgv(FreeLoopbackPort(), "cache-usage");
  struct Case {
    std::string flag, expect;
  };
  for (const Case& c : {
           Case{"--decode_threads=100000", "--decode_threads 100000 is out of range: use 0..1024"},
           Case{"--memory_budget=1K", "--memory_budget 1K is out of range: use 16.0 MiB to"},
           Case{"--cache_capacity=1K", "--cache_capacity 1K is out of range: use 64.0 MiB to"},
           Case{"--window=0", "--window 0 is out of range: use 1..256"},
           Case{"--queue_depth=0", "--queue_depth 0 is out of range: use 1..4096"},
           Case{"--block_size=1000", "--block_size 1000 is out of range"},
           Case{"--block_size=6K", "is not a multiple of 4K"},
           Case{"--no_such_flag=1", "unknown flag --no_such_flag"},
           Case{"--log_level=loud", "--log_level"},
           Case{"--metrics=nonsense", "--metrics 'nonsense' has no port"},
           Case{"--metrics=127.0.0.1:99999", "--metrics '127.0.0.1:99999' has a port out of range"},
           Case{"--listen=bogus", "--listen 'bogus' has no port"},
           Case{"--listen=unix:", "--listen 'unix:' names no socket path"},
           Case{"--packer=", "--packer '' has no port"},
           Case{"--packer=127.0.0.1:0", "--packer '127.0.0.1:0' has a port out of range: use "
                                        "HOST:PORT or [IPV6]:PORT with PORT 1..65535"},
       }) {
    std::vector<std::string> argv = base;
    argv.push_back(c.flag);
    RunResult r = RunCommand(argv, absl::Seconds(30));
    EXPECT_EQ(r.status, 2) << c.flag << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.expect)) << c.flag;
  }
  // Flags each in range whose product the daemon allocates at start.
  std::vector<std::string> buffers = base;
  buffers.push_back("--queue_depth=4096");
  buffers.push_back("--block_size=64M");
  RunResult b = RunCommand(buffers, absl::Seconds(30));
  EXPECT_EQ(b.status, 2) << b.output;
  EXPECT_THAT(b.output, HasSubstr("--queue_depth 4096 x --block_size 64M is more than 4G of "
                                  "staging buffers"));
  RunResult p = RunCommand({Packerd(), "--config=x", "--plan_threads=0"}, absl::Seconds(30));
  EXPECT_EQ(p.status, 2) << p.output;
  EXPECT_THAT(p.output, HasSubstr("--plan_threads 0 is out of range: use 1..256"));
  for (const Case& c : {Case{"--metrics=127.0.0.1:70000", "--metrics '127.0.0.1:70000' has a "
                                                          "port out of range"},
                        Case{"--listen=localhost", "--listen 'localhost' has no port"}}) {
    RunResult r = RunCommand({Packerd(), "--config=x", c.flag}, absl::Seconds(30));
    EXPECT_EQ(r.status, 2) << c.flag << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.expect)) << c.flag;
  }
  for (const std::string& binary : {std::string(Packerd()), std::string(Stagerd())}) {
    RunResult h = RunCommand({binary, "--help"}, absl::Seconds(30));
    EXPECT_EQ(h.status, 0);
    EXPECT_THAT(h.output, HasSubstr("Exit status: 0 clean exit, 1 runtime failure, 2 bad usage"));
    EXPECT_THAT(h.output, HasSubstr("--log_format"));
    EXPECT_THAT(h.output, HasSubstr("--log_level"));
  }
}

TEST_F(Lifecycle, APortInUseIsOneClearLineAndExitOne) {
  auto packer = Daemon::Start("port-packer", PackerArgv(), Dir());
  ASSERT_TRUE(packer.ok()) << packer.status();
  std::vector<std::string> argv = StagerArgv((*packer)->grpc_port(), "cache-port");
  argv.push_back((*packer)->address().insert(0, "--listen="));
  RunResult r = RunCommand(argv, absl::Seconds(30));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr((*packer)->address() + ": the port is in use"));
  // gRPC's own bind failure ("E1201 ... Failed to add :: listener") is not logged.
  EXPECT_THAT(r.output, Not(::testing::ContainsRegex("(^|\n)E[0-9]{4} ")));
  EXPECT_THAT(r.output, Not(HasSubstr("ERROR grpc")));
  EXPECT_TRUE((*packer)->Stop().ok());
}

}  // namespace
}  // namespace tutti::e2e
