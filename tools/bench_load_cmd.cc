// `tutti bench load`: one tutti-packerd (started here, a real process on
// loopback) serving thousands of concurrent clients, each on its own
// connection, streaming plans and calling GetPlan for steps planned before
// the load starts; per round the latency of every plan (p50, p99, max) and
// the packer's CPU (cores) and resident memory, repeated over rounds to show
// the memory does not grow. The job is the packer benchmark's seed workload
// at the clients' world size.
#include <fcntl.h>
#include <google/protobuf/text_format.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/file_io.h"
#include "common/http_client.h"
#include "services/packer/bench/bench_workload.h"
#include "services/packer/bench/synthetic.h"
#include "tools/bench_load.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tutti/v1/packer.grpc.pb.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// CPU seconds (user + system) and resident bytes of a process, from /proc.
struct ProcSample {
  double cpu_seconds = 0;
  uint64_t rss_bytes = 0;
};

ProcSample ReadProc(pid_t pid) {
  ProcSample p;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(stat, line);
  // Fields after the command name (which may hold spaces) start after ") ".
  const size_t close = line.rfind(')');
  if (close != std::string::npos) {
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    std::vector<std::string> f;
    while (rest >> field) f.push_back(field);
    // state(3) ... utime(14) stime(15), counted from 1 with pid and comm.
    if (f.size() > 12) {
      const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
      p.cpu_seconds = (std::stod(f[11]) + std::stod(f[12])) / hz;
    }
  }
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      uint64_t kb = 0;
      std::istringstream(line.substr(6)) >> kb;
      p.rss_bytes = kb * 1024;
    }
  }
  return p;
}

std::string PackerdBinary(const std::string& given) {
  if (!given.empty()) return given;
  const fs::path self = fs::read_symlink("/proc/self/exe");
  for (const fs::path& p : {self.parent_path().parent_path() / "services/packer/tutti-packerd",
                            self.parent_path() / "tutti-packerd"}) {
    if (fs::exists(p)) return p.string();
  }
  return "tutti-packerd";
}

// tutti-packerd on loopback for the lifetime of the object.
class Packerd {
 public:
  ~Packerd() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }

  absl::Status Start(const std::string& binary, const std::string& dir,
               const std::vector<std::string>& extra) {
    const std::string port_file = dir + "/packerd.ports";
    fs::remove(port_file);
    const std::string log = dir + "/packerd.log";
    pid_ = ::fork();
    if (pid_ < 0) return absl::InternalError("fork failed");
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      const std::string config = "--config=" + dir + "/job.textproto";
      const std::string index = "--index=" + dir + "/job.idx";
      const std::string ports = "--port_file=" + port_file;
      std::vector<std::string> args = {binary, config, index, "--listen=127.0.0.1:0",
                                       "--metrics=127.0.0.1:0", ports};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(binary.c_str(), argv.data());
      std::fprintf(stderr, "exec %s failed\n", binary.c_str());
      ::_exit(127);
    }
    const auto deadline = Clock::now() + std::chrono::seconds(600);
    while (Clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        auto text = tutti::ReadFileToString(log);
        return absl::FailedPreconditionError(
            absl::StrCat("tutti-packerd exited: ", text.ok() ? *text : ""));
      }
      auto ports = tutti::ReadFileToString(port_file);
      int port = 0;
      if (ports.ok() && PortIn(*ports, "grpc=", &port) &&
          PortIn(*ports, "metrics=", &metrics_port_)) {
        address_ = absl::StrCat("127.0.0.1:", port);
        return absl::OkStatus();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return absl::DeadlineExceededError("tutti-packerd did not write its port file in 600 s");
  }

  pid_t pid() const { return pid_; }
  const std::string& address() const { return address_; }

  // The packer's heap in use (tutti_process_heap_in_use_bytes from its
  // /metrics): what it has allocated, resident or not; -1 if unreadable.
  double HeapInUse() const {
    auto text = tutti::HttpGet(metrics_port_, "/metrics", absl::Seconds(30));
    if (!text.ok()) return -1;
    return tutti::MetricValue(*text, "tutti_process_heap_in_use_bytes").value_or(-1);
  }

 private:
  // The port after `key` on its line of the port file.
  static bool PortIn(const std::string& ports, const std::string& key, int* port) {
    const size_t at = ports.find(key);
    const size_t nl = at == std::string::npos ? at : ports.find('\n', at);
    return nl != std::string::npos &&
           absl::SimpleAtoi(ports.substr(at + key.size(), nl - at - key.size()), port);
  }

  pid_t pid_ = -1;
  std::string address_;
  int metrics_port_ = 0;
};

// Plans steps [0, steps) through one client, then waits until the packer
// has also planned its window ahead and is idle: what the load asks for is
// then served from plans already made.
absl::Status Precompute(const std::string& address, pid_t pid, uint32_t steps, uint32_t world) {
  auto stub =
      tutti::v1::Packer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  for (uint32_t s = 0; s < steps; ++s) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(600));
    tutti::v1::GetPlanRequest req;
    req.set_step(s);
    req.add_ranks(0);
    req.set_world_size(world);
    tutti::v1::StepPlan plan;
    grpc::Status st = stub->GetPlan(&ctx, req, &plan);
    if (!st.ok()) {
      return absl::UnavailableError(
          absl::StrCat("precomputing step ", s, ": ", st.error_message()));
    }
  }
  const auto deadline = Clock::now() + std::chrono::seconds(900);
  int quiet = 0;
  ProcSample last = ReadProc(pid);
  while (quiet < 3 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const ProcSample now = ReadProc(pid);
    quiet = now.cpu_seconds - last.cpu_seconds < 0.03 ? quiet + 1 : 0;
    last = now;
  }
  return quiet >= 3 ? absl::OkStatus()
                    : absl::DeadlineExceededError("the packer kept planning for 900 s");
}

absl::Status WriteJob(const std::string& dir, uint32_t world, uint32_t seq_len, uint32_t steps,
                      uint32_t* samples_out) {
  tutti::packer::SeedWorkloadOptions wo;
  wo.seq_len = seq_len;
  // Enough samples for 2 x steps steps (the precomputed ones and the window
  // planned ahead of them) at about 1,400 tokens a sample.
  const uint64_t samples =
      std::max<uint64_t>(20000, uint64_t{world} * wo.seqs_per_rank * seq_len / 1400 * 2 * steps);
  auto bytes = tutti::packer::MakeSyntheticIndex(tutti::packer::SeedSyntheticOptions(wo, samples));
  if (!bytes.ok()) return bytes.status();
  auto index = tutti::packer::Index::FromString(*bytes, "load.idx");
  if (!index.ok()) return index.status();
  auto shape = tutti::packer::SeedShape(wo, **index, world, tutti::packer::kSeedStage1MaxPixels);
  if (!shape.ok()) return shape.status();
  tutti::v1::JobConfig config = tutti::packer::SeedConfig(
      wo, *shape, world, tutti::packer::kSeedStage1MaxPixels, "tutti", 0, false);
  config.set_job_id("bench-load");
  config.set_plan_window(steps);
  std::string text;
  google::protobuf::TextFormat::PrintToString(config, &text);
  if (absl::Status s = tutti::WriteFileAtomically(dir + "/job.idx", *bytes); !s.ok()) return s;
  *samples_out = static_cast<uint32_t>(samples);
  return tutti::WriteFileAtomically(dir + "/job.textproto", text);
}

int RunBenchLoad(int argc, char** argv) {
  uint32_t clients = 2560, rounds = 3, calls = 6, stream_plans = 4, steps = 8, seq_len = 8192;
  uint32_t timeout_s = 300, interval_ms = 1000;
  double max_rss_growth_mib = 4;
  std::string dir, packerd, packerd_args;
  bool json = false;
  tutti::tools::Cli cli(
      "tutti bench load [--clients N] [--rounds N] [--json] [options]",
      "Starts tutti-packerd on loopback with the seed workload for --clients ranks, plans "
      "--steps steps, then holds --clients concurrent clients (one connection each) that "
      "alternate StreamPlans (--stream_plans plans) and GetPlan, --calls calls per client per "
      "round, one every --interval_ms per client (spread evenly; 0: back to back). Reports per "
      "round the latency of every plan received (p50, p99, max; counted from when the call "
      "was due) and the packer's CPU (cores) and resident memory. Exits 1 if any call "
      "failed.");
  cli.Flag("clients", &clients, "concurrent clients; also the job's world size");
  cli.Flag("rounds", &rounds, "rounds of load (memory is compared across them)");
  cli.Flag("calls", &calls, "calls per client per round (streams and GetPlans alternating)");
  cli.Flag("stream_plans", &stream_plans, "plans per StreamPlans call");
  cli.Flag("interval_ms", &interval_ms,
           "each client starts a call this often (a step's cadence); 0: back to back");
  cli.Flag("steps", &steps, "steps planned before the load; the clients ask only for these");
  cli.Flag("seq_len", &seq_len, "the job's sequence length (tokens)");
  cli.Flag("timeout_s", &timeout_s, "a round ends after this, its unfinished calls failed");
  cli.Flag("dir", &dir,
           "work directory for the job files and the packer's log (default: a new one under "
           "$TMPDIR or /tmp, removed after a successful run and kept after a failed one)");
  cli.Flag("packerd", &packerd, "tutti-packerd binary (default: from this build)");
  cli.Flag("packerd_args", &packerd_args,
           "more tutti-packerd flags, space-separated (e.g. \"--served_plan_precompute=none\")");
  cli.Flag("json", &json, "one JSON object per round instead of a table");
  cli.Flag("max_rss_growth_mib", &max_rss_growth_mib,
           "with 3 or more rounds: exit 1 if the packer's RSS grew more than this from the end "
           "of round 2 to the end of the last round");
  int code = 0;
  if (!cli.Parse(argc, argv, &code)) return code;
  if (clients == 0 || rounds == 0 || calls == 0 || stream_plans == 0 || steps == 0 ||
      timeout_s == 0) {
    std::fprintf(stderr,
                 "tutti bench load: --clients, --rounds, --calls, --stream_plans, "
                 "--steps and --timeout_s must be positive\n");
    return 2;
  }
  // Two descriptors per client here and one per client in the packer.
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  if (nofile.rlim_cur < 2ull * clients + 256) {
    nofile.rlim_cur = std::min<rlim_t>(nofile.rlim_max, 2ull * clients + 256);
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  const bool own_dir = dir.empty();
  if (own_dir) {
    std::error_code ec;
    std::string tmpl = (fs::temp_directory_path(ec) / "tutti-bench-load-XXXXXX").string();
    if (ec || ::mkdtemp(tmpl.data()) == nullptr) {
      std::fprintf(stderr, "tutti bench load: cannot create a work directory %s: %s\n",
                   tmpl.c_str(), ec ? ec.message().c_str() : std::strerror(errno));
      return 1;
    }
    dir = tmpl;
  }
  fs::create_directories(dir);
  // A work directory of its own is removed after a successful run (the
  // packer has stopped by then); after a failure it is kept for the
  // packer's log, and named.
  bool succeeded = false;
  absl::Cleanup tidy = [&] {
    if (!own_dir) return;
    std::error_code ec;
    if (succeeded) {
      fs::remove_all(dir, ec);
    } else {
      std::fprintf(stderr, "tutti bench load: kept %s (the packer's log is %s/packerd.log)\n",
                   dir.c_str(), dir.c_str());
    }
  };
  auto t0 = Clock::now();
  uint32_t samples = 0;
  if (absl::Status s = WriteJob(dir, clients, seq_len, steps, &samples); !s.ok()) {
    std::fprintf(stderr, "tutti bench load: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::fprintf(stderr, "job: %u ranks, %u synthetic samples, seq_len %u (%.1f s)\n", clients,
               samples, seq_len, Seconds(t0));
  Packerd packer;
  const std::vector<std::string> extra = absl::StrSplit(packerd_args, ' ', absl::SkipEmpty());
  if (absl::Status s = packer.Start(PackerdBinary(packerd), dir, extra); !s.ok()) {
    std::fprintf(stderr, "tutti bench load: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  t0 = Clock::now();
  if (absl::Status s = Precompute(packer.address(), packer.pid(), steps, clients); !s.ok()) {
    std::fprintf(stderr, "tutti bench load: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::fprintf(stderr, "precomputed %u steps and the window ahead (%.1f s)\n", steps, Seconds(t0));
  tutti::tools::LoadOptions o;
  o.target = packer.address();
  o.clients = clients;
  o.world_size = clients;
  o.first_step = 0;
  o.last_step = steps - 1;
  o.calls = calls;
  o.stream_plans = stream_plans;
  o.interval = absl::Milliseconds(interval_ms);
  o.round_timeout = absl::Seconds(timeout_s);
  auto driver = tutti::tools::LoadDriver::Connect(o, absl::Seconds(120));
  if (!driver.ok()) {
    std::fprintf(stderr, "tutti bench load: %s\n", std::string(driver.status().message()).c_str());
    return 1;
  }
  if (!json) {
    std::printf("%5s %7s %9s %7s %8s %8s %8s %8s %8s %9s %10s %8s %9s %10s %11s %10s\n",
                "round", "clients", "plans", "errors", "seconds", "p50_ms", "p99_ms", "max_ms",
                "rpc_p99", "late_p99", "cpu_cores", "us/plan", "rss_MiB", "rss_d2_MiB",
                "heap_d2_MiB", "drv_cores");
  }
  // RSS growth is counted from the end of round 2: round 1 keeps what the
  // load needs at all (the served plans, connections' buffers), later
  // rounds should keep nothing more. The heap in use beside it tells memory
  // the packer allocated from pages of what it had allocated already
  // becoming resident.
  uint64_t second_rss = 0, errors = 0;
  int64_t last_growth = 0;
  double second_heap = 0, heap_growth = 0;
  bool heap_known = false;
  for (uint32_t r = 1; r <= rounds; ++r) {
    const ProcSample before = ReadProc(packer.pid()), self_before = ReadProc(::getpid());
    const tutti::tools::LoadRound lr = (*driver)->RunRound(r);
    const ProcSample after = ReadProc(packer.pid()), self_after = ReadProc(::getpid());
    const double cpu = after.cpu_seconds - before.cpu_seconds;
    const double cores = cpu / std::max(lr.seconds, 1e-9);
    const double driver_cores =
        (self_after.cpu_seconds - self_before.cpu_seconds) / std::max(lr.seconds, 1e-9);
    // The packer's CPU per plan served: what the load costs it, whatever
    // else the machine runs.
    const double us_per_plan = lr.plans > 0 ? cpu / lr.plans * 1e6 : 0;
    // Read after the round's CPU: the scrape is not the load's cost.
    const double heap = packer.HeapInUse();
    if (r <= 2) second_rss = after.rss_bytes;
    if (r <= 2) second_heap = heap;
    const int64_t growth =
        static_cast<int64_t>(after.rss_bytes) - static_cast<int64_t>(second_rss);
    last_growth = growth;
    // A packer that does not export its heap (an older binary) reads -1.
    heap_known = heap >= 0 && second_heap >= 0;
    heap_growth = heap_known ? heap - second_heap : 0;
    errors += lr.errors;
    if (json) {
      std::printf(
          "{\"round\":%u,\"clients\":%u,\"calls_per_client\":%u,\"interval_ms\":%u,"
          "\"get_plan_calls\":%llu,"
          "\"streams\":%llu,\"plans\":%llu,\"errors\":%llu,\"seconds\":%.3f,\"p50_ms\":%.3f,"
          "\"p99_ms\":%.3f,\"max_ms\":%.3f,\"get_plan_p50_ms\":%.3f,\"get_plan_p99_ms\":%.3f,"
          "\"stream_p50_ms\":%.3f,\"stream_p99_ms\":%.3f,\"late_p99_ms\":%.3f,"
          "\"packer_cpu_cores\":%.3f,\"packer_cpu_us_per_plan\":%.1f,\"driver_cpu_cores\":%.3f,"
          "\"packer_rss_bytes\":%llu,\"packer_rss_growth_bytes\":%lld,"
          "\"packer_heap_in_use_bytes\":%.0f,\"packer_heap_growth_bytes\":%.0f}\n",
          r, lr.clients, calls, interval_ms, static_cast<unsigned long long>(lr.unary_calls),
          static_cast<unsigned long long>(lr.streams), static_cast<unsigned long long>(lr.plans),
          static_cast<unsigned long long>(lr.errors), lr.seconds, lr.p50_ms, lr.p99_ms, lr.max_ms,
          lr.unary_p50_ms, lr.unary_p99_ms, lr.stream_p50_ms, lr.stream_p99_ms, lr.late_p99_ms,
          cores, us_per_plan, driver_cores, static_cast<unsigned long long>(after.rss_bytes),
          static_cast<long long>(growth), heap, heap_growth);
    } else {
      std::printf(
          "%5u %7u %9llu %7llu %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f %10.2f %8.1f %9.1f %10.1f "
          "%11.1f %10.2f\n",
          r,
          lr.clients, static_cast<unsigned long long>(lr.plans),
          static_cast<unsigned long long>(lr.errors), lr.seconds, lr.p50_ms, lr.p99_ms, lr.max_ms,
          lr.unary_p99_ms, lr.late_p99_ms, cores, us_per_plan, after.rss_bytes / 1048576.0,
          growth / 1048576.0, heap_growth / 1048576.0, driver_cores);
    }
    std::fflush(stdout);
    if (!lr.first_error.empty()) {
      std::fprintf(stderr, "round %u: first error: %s\n", r, lr.first_error.c_str());
    }
  }
  if (rounds >= 3) {
    const double mib = last_growth / 1048576.0;
    const bool flat = mib <= max_rss_growth_mib;
    std::fprintf(stderr,
                 "packer RSS from round 2 to round %u: %+.1f MiB (%.2f MiB a round; limit "
                 "--max_rss_growth_mib %.1f): %s; heap in use %s\n",
                 rounds, mib, mib / (rounds - 2), max_rss_growth_mib, flat ? "flat" : "GROWS",
                 heap_known ? absl::StrFormat("%+.1f MiB", heap_growth / 1048576.0).c_str()
                            : "unknown (the packer exports no tutti_process_heap_in_use_bytes: "
                              "an older binary, or a sanitizer build)");
    if (!flat) return 1;
  }
  succeeded = errors == 0;
  return succeeded ? 0 : 1;
}

}  // namespace

TUTTI_COMMAND("bench load", "thousands of concurrent clients against one tutti-packerd",
              RunBenchLoad);
