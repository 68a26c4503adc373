#include "tests/e2e_support.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

extern char** environ;

namespace tutti::e2e {
namespace fs = std::filesystem;

const char* TuttiCli() { return TUTTI_CLI_BINARY; }
const char* Packerd() { return TUTTI_PACKERD_BINARY; }
const char* Stagerd() { return TUTTI_STAGERD_BINARY; }
const char* RankDemo() { return TUTTI_RANK_DEMO_BINARY; }
const char* E2eRanks() { return TUTTI_E2E_RANKS_BINARY; }
const char* Mpirun() { return TUTTI_MPIEXEC; }

std::string MakeTempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl = absl::StrCat(base != nullptr && *base ? base : "/tmp", "/tutti_", name, "_",
                                  ::getpid(), "_XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "mkdtemp %s: %s\n", tmpl.c_str(), std::strerror(errno));
    std::abort();
  }
  return tmpl;
}

void RemoveTree(const std::string& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Tail(const std::string& text, int lines) {
  size_t pos = text.size();
  if (pos > 0 && text[pos - 1] == '\n') --pos;
  for (int n = 0; n < lines && pos != std::string::npos && pos > 0; ++n) {
    pos = text.rfind('\n', pos - 1);
  }
  return pos == std::string::npos ? text : text.substr(pos + (pos > 0 ? 1 : 0));
}

std::string CommandLine(const std::vector<std::string>& argv) { return absl::StrJoin(argv, " "); }

// ------------------------------------------------------------------ Process

absl::StatusOr<std::unique_ptr<Process>> Process::Start(const std::vector<std::string>& argv,
                                                        const std::string& log,
                                                        const std::vector<std::string>& env) {
  if (argv.empty()) return absl::InvalidArgumentError("no command");
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) envs.emplace_back(*e);
  for (const std::string& kv : env) {
    const std::string name = kv.substr(0, kv.find('=') + 1);
    std::erase_if(envs, [&](const std::string& e) { return e.rfind(name, 0) == 0; });
    envs.push_back(kv);
  }
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGINT);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, cargv[0], &actions, &attr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return ErrnoStatus(rc, absl::StrCat("starting ", CommandLine(argv)));
  std::unique_ptr<Process> p(new Process());
  p->pid_ = pid;
  p->log_ = log;
  return p;
}

Process::~Process() {
  if (pid_ > 0 && !status_.has_value()) {
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
  }
}

void Process::Signal(int sig) const {
  if (!status_.has_value()) ::kill(pid_, sig);
}

void Process::SignalGroup(int sig) const {
  if (!status_.has_value()) ::kill(-pid_, sig);
}

bool Process::Running() { return !Wait(absl::ZeroDuration()).has_value(); }

std::optional<int> Process::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!status_.has_value()) {
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
      break;
    }
    if (r < 0 && errno != EINTR) {
      status_ = -1000;  // not our child any more: nothing to wait for
      break;
    }
    if (absl::Now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status_;
}

RunResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout,
                     const std::vector<std::string>& env, const std::string& log) {
  RunResult r;
  std::string path = log;
  std::string tmp_dir;
  if (path.empty()) {
    tmp_dir = MakeTempDir("run");
    path = tmp_dir + "/output.log";
  }
  const absl::Time start = absl::Now();
  auto p = Process::Start(argv, path, env);
  if (!p.ok()) {
    r.output = std::string(p.status().message());
    RemoveTree(tmp_dir);
    return r;
  }
  std::optional<int> st = (*p)->Wait(timeout);
  if (!st.has_value()) {
    r.timed_out = true;
    (*p)->SignalGroup(SIGTERM);
    st = (*p)->Wait(absl::Seconds(5));
    if (!st.has_value()) {
      (*p)->SignalGroup(SIGKILL);
      st = (*p)->Wait(absl::Seconds(5));
    }
  }
  r.status = st.value_or(-SIGKILL);
  r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  r.output = ReadFileOrEmpty(path);
  if (r.timed_out) {
    absl::StrAppend(&r.output, "\n[killed after ", absl::FormatDuration(timeout), ": ",
                    CommandLine(argv), "]\n");
  }
  RemoveTree(tmp_dir);
  return r;
}

// ------------------------------------------------------------------- Daemon

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const std::string& name,
                                                      std::vector<std::string> argv,
                                                      const std::string& dir,
                                                      absl::Duration ready) {
  const std::string port_file = absl::StrCat(dir, "/", name, ".ports");
  const std::string log = absl::StrCat(dir, "/", name, ".log");
  std::error_code ec;
  fs::remove(port_file, ec);
  argv.push_back("--port_file=" + port_file);
  std::unique_ptr<Daemon> d(new Daemon());
  d->name_ = name;
  ASSIGN_OR_RETURN(d->process_, Process::Start(argv, log));
  const absl::Time deadline = absl::Now() + ready;
  for (;;) {
    const std::string ports = ReadFileOrEmpty(port_file);
    int grpc = 0, metrics = 0;
    std::string grpc_address;
    for (absl::string_view line : absl::StrSplit(ports, '\n', absl::SkipEmpty())) {
      if (absl::ConsumePrefix(&line, "grpc=")) (void)absl::SimpleAtoi(line, &grpc);
      if (absl::ConsumePrefix(&line, "metrics=")) (void)absl::SimpleAtoi(line, &metrics);
      if (absl::ConsumePrefix(&line, "grpc_address=")) grpc_address = std::string(line);
    }
    // A Unix socket has no port: its address says the daemon serves.
    if ((grpc > 0 || absl::StartsWith(grpc_address, "unix:")) && metrics > 0) {
      d->grpc_port_ = grpc;
      d->metrics_port_ = metrics;
      d->grpc_address_ = grpc_address;
      return d;
    }
    if (!d->process_->Running()) {
      return absl::FailedPreconditionError(
          absl::StrCat(name, " exited with status ", *d->process_->exit_status(),
                       " before it was ready: ", CommandLine(argv), "\n", Tail(d->log())));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(name, " was not ready after ",
                                                      absl::FormatDuration(ready), ": ",
                                                      CommandLine(argv), "\n", Tail(d->log())));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string Daemon::address() const {
  if (absl::StartsWith(grpc_address_, "unix:")) return grpc_address_;
  return absl::StrCat("127.0.0.1:", grpc_port_);
}

absl::Status Daemon::Stop(absl::Duration timeout) {
  RequestStop();
  return AwaitStop(timeout);
}

void Daemon::RequestStop() { process_->Signal(SIGTERM); }

absl::Status Daemon::AwaitStop(absl::Duration timeout) {
  std::optional<int> st = process_->Wait(timeout);
  if (!st.has_value()) {
    process_->SignalGroup(SIGKILL);
    process_->Wait(absl::Seconds(5));
    return absl::DeadlineExceededError(absl::StrCat(name_, " did not exit within ",
                                                    absl::FormatDuration(timeout), " of SIGTERM\n",
                                                    Tail(log())));
  }
  if (*st != 0) {
    return absl::InternalError(
        absl::StrCat(name_, " exited with status ", *st, " after SIGTERM\n", Tail(log())));
  }
  return absl::OkStatus();
}

// --------------------------------------------------------------------- HTTP

int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// ------------------------------------------------------------- dataset, job

absl::Status GenerateDataset(const std::string& dir, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {TuttiCli(),
                                   "gen-dataset",
                                   "--out=" + dir,
                                   "--samples=96",
                                   "--samples-per-shard=32",
                                   "--text-fraction=0.6",
                                   "--large-fraction=0",
                                   "--max-megapixels=0.3",
                                   "--text-tokens-median=128",
                                   "--threads=2",
                                   "--quiet"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  RunResult r = RunCommand(argv, absl::Seconds(120));
  if (r.status != 0) {
    return absl::InternalError(
        absl::StrCat(CommandLine(argv), " exited with ", r.status, ":\n", Tail(r.output)));
  }
  return absl::OkStatus();
}

absl::Status BuildIndex(const std::string& source, const std::string& index,
                        const std::vector<std::string>& extra, std::string* output) {
  std::vector<std::string> argv = {TuttiCli(), "index", "--source=" + source, "--out=" + index};
  argv.insert(argv.end(), extra.begin(), extra.end());
  RunResult r = RunCommand(argv, absl::Seconds(60));
  if (output != nullptr) *output = r.output;
  if (r.status != 0) {
    return absl::InternalError(
        absl::StrCat(CommandLine(argv), " exited with ", r.status, ":\n", Tail(r.output)));
  }
  return absl::OkStatus();
}

std::string JobConfigText(const std::string& index_path, int epochs) {
  // Stagers name their shared-memory segments after the job: tests running
  // side by side need distinct job ids.
  std::string id = fs::path(index_path).parent_path().filename().string();
  for (char& c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '-';
  }
  return absl::StrCat("job_id: \"", id, "\"\nindex_path: \"", index_path, "\"\nepochs: ", epochs,
                      R"pb(
                        seed: 5
                        world_size: 4
                        ranks_per_node: 2
                        plan_window: 4
                        batch {
                          text_samples_per_step: 8
                          vl_samples_per_step: 4
                          grad_accum: 2
                          text_micro_batch: 2
                          vl_micro_batch: 1
                          text_vl_ratio: "2:1"
                        }
                        curriculum { start_step: 0 max_pixels: 262144 seq_len: 8192 }
                        curriculum { start_step: 3 max_pixels: 401408 seq_len: 8192 }
                        post_balancing { enabled: true hidden_size: 1024 }
                      )pb");
}

// ------------------------------------------------------------------ Cluster

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(const ClusterOptions& o) {
  const std::string job = o.dir + "/job.textproto";
  {
    std::ofstream out(job);
    out << o.job_config;
    if (!out) return absl::InternalError("cannot write " + job);
  }
  std::unique_ptr<Cluster> c(new Cluster());
  std::vector<std::string> packer = {Packerd(), "--config=" + job, "--listen=127.0.0.1:0",
                                     "--metrics=127.0.0.1:0"};
  packer.insert(packer.end(), o.packer_flags.begin(), o.packer_flags.end());
  ASSIGN_OR_RETURN(c->packer_, Daemon::Start("packer", packer, o.dir));
  std::vector<int> ports;
  std::vector<std::string> peers;
  for (int node = 0; o.peers && node < o.nodes; ++node) {
    ports.push_back(FreeLoopbackPort());
    peers.push_back(absl::StrCat(node, "=127.0.0.1:", ports.back()));
  }
  for (int node = 0; node < o.nodes; ++node) {
    std::vector<std::string> argv = {Stagerd(),
                                     "--packer=" + c->packer_->address(),
                                     absl::StrCat("--node=", node),
                                     "--source=" + o.source,
                                     absl::StrCat("--cache=", o.dir, "/cache", node),
                                     "--listen=127.0.0.1:0",
                                     "--metrics=127.0.0.1:0",
                                     "--decode_threads=1",
                                     "--memory_budget=512M",
                                     "--packer_wait_s=20"};
    argv.insert(argv.end(), o.stager_flags.begin(), o.stager_flags.end());
    if (o.peers) {
      argv.push_back(absl::StrCat("--listen=127.0.0.1:", ports[static_cast<size_t>(node)]));
      argv.push_back("--peers=" + absl::StrJoin(peers, ","));
    }
    ASSIGN_OR_RETURN(auto stager, Daemon::Start(absl::StrCat("stager", node), argv, o.dir));
    c->stagers_.push_back(std::move(stager));
  }
  return c;
}

std::string Cluster::StagerList() const {
  std::vector<std::string> list;
  for (const auto& s : stagers_) list.push_back(s->address());
  return absl::StrJoin(list, ",");
}

absl::Status Cluster::Stop() {
  absl::Status first;
  for (auto& s : stagers_) s->RequestStop();
  packer_->RequestStop();
  for (auto& s : stagers_) first.Update(s->AwaitStop());
  first.Update(packer_->AwaitStop());
  return first;
}

std::vector<std::string> MpirunArgv(int ranks, const std::vector<std::string>& argv) {
  std::vector<std::string> out = {Mpirun(), "-np", std::to_string(ranks), "--oversubscribe"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

std::vector<std::string> MpiEnv() {
  return {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
          "OMPI_MCA_rmaps_base_oversubscribe=1"};
}

}  // namespace tutti::e2e
