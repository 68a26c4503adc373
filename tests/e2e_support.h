// What the end-to-end tests share: real processes (the tutti CLI, the
// daemons, mpirun) started with bounded waits and their output kept, a
// cluster of one tutti-packerd and N tutti-stagerd on loopback ports the OS
// picks, and a tiny HTTP GET for /metrics and the Prometheus API.
//
// Thread-compatible: use each object from one thread.
#ifndef TUTTI_TESTS_E2E_SUPPORT_H_
#define TUTTI_TESTS_E2E_SUPPORT_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/http_client.h"

namespace tutti::e2e {

// Paths of the programs under test (set by tests/CMakeLists.txt).
const char* TuttiCli();
const char* Packerd();
const char* Stagerd();
const char* RankDemo();
const char* E2eRanks();
const char* Mpirun();

// A fresh directory for one test: $TEST_TMPDIR or /tmp, then
// tutti_<name>_<pid>_XXXXXX. Removed by RemoveTree.
std::string MakeTempDir(const std::string& name);
void RemoveTree(const std::string& dir);
std::string ReadFileOrEmpty(const std::string& path);
// The last `lines` lines of `text`.
std::string Tail(const std::string& text, int lines = 20);

// One child process in its own process group, stdout and stderr appended to
// a log file. The destructor kills the group (SIGKILL) if it still runs.
class Process {
 public:
  // `env` entries ("NAME=value") are added to this process's environment.
  static absl::StatusOr<std::unique_ptr<Process>> Start(const std::vector<std::string>& argv,
                                                        const std::string& log,
                                                        const std::vector<std::string>& env = {});
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_; }
  std::string log() const { return ReadFileOrEmpty(log_); }
  // Signals the process (not its group).
  void Signal(int sig) const;
  // Signals the whole process group (mpirun and its ranks).
  void SignalGroup(int sig) const;
  // Still running (reaps it when it has exited).
  bool Running();
  // Waits up to `timeout` for the exit; the exit status (>= 0) or -signal,
  // or nullopt when it still runs.
  std::optional<int> Wait(absl::Duration timeout);
  std::optional<int> exit_status() const { return status_; }

 private:
  Process() = default;
  pid_t pid_ = -1;
  std::string log_;
  std::optional<int> status_;
};

struct RunResult {
  int status = -1;  // exit status, or -signal
  bool timed_out = false;
  std::string output;  // stdout and stderr
  double seconds = 0;
};

// Runs a command to completion; after `timeout` its process group is killed
// (SIGTERM, then SIGKILL 5 s later) and timed_out is set.
RunResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout,
                     const std::vector<std::string>& env = {}, const std::string& log = "");

// "argv[0] arg1 ...", for messages.
std::string CommandLine(const std::vector<std::string>& argv);

// A tutti daemon started with --listen/--metrics on port 0 and a port file.
class Daemon {
 public:
  // Starts `argv` + --port_file=DIR/NAME.ports and waits (up to `ready`)
  // until the port file names both ports (or, on a Unix socket, the metrics
  // port and the socket's address). Fails with the log's tail when the
  // daemon exits first or never becomes ready.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const std::string& name,
                                                       std::vector<std::string> argv,
                                                       const std::string& dir,
                                                       absl::Duration ready = absl::Seconds(30));
  const std::string& name() const { return name_; }
  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  std::string address() const;  // 127.0.0.1:PORT, or unix:PATH on a Unix socket
  Process& process() { return *process_; }
  std::string log() const { return process_->log(); }
  // SIGTERM, then waits up to `timeout` for exit status 0; the error carries
  // the log's tail.
  absl::Status Stop(absl::Duration timeout = absl::Seconds(20));
  // Stop() in two halves, so that several daemons stop at the same time.
  void RequestStop();
  absl::Status AwaitStop(absl::Duration timeout = absl::Seconds(20));

 private:
  std::string name_;
  std::unique_ptr<Process> process_;
  int grpc_port_ = 0, metrics_port_ = 0;
  std::string grpc_address_;  // as the port file names it
};

using ::tutti::HttpGet;  // common/http_client.h
// A loopback TCP port that was free a moment ago.
int FreeLoopbackPort();
using ::tutti::MetricValue;  // common/http_client.h

// `tutti gen-dataset --out dir` with small, fast defaults plus `extra` flags.
absl::Status GenerateDataset(const std::string& dir, const std::vector<std::string>& extra = {});
// `tutti index --source source --out index` plus `extra`; its output in *output.
absl::Status BuildIndex(const std::string& source, const std::string& index,
                        const std::vector<std::string>& extra = {}, std::string* output = nullptr);

// A job config for 4 ranks on 2 nodes, 8 text + 4 VL samples per step,
// post-balancing on, max_pixels 262144 then 401408 from step 3; the job id
// is the name of the index's directory.
std::string JobConfigText(const std::string& index_path, int epochs);

struct ClusterOptions {
  std::string dir;         // logs, port files, caches, the job config
  std::string job_config;  // text JobConfig
  std::string source;      // dataset directory the stagers read
  int nodes = 2;
  std::vector<std::string> stager_flags;  // extra tutti-stagerd flags
  std::vector<std::string> packer_flags;  // extra tutti-packerd flags
  // Each stager listens on a loopback port picked ahead, and every stager is
  // given all of them in --peers (stager to stager member fetches).
  bool peers = false;
};

// One tutti-packerd and `nodes` tutti-stagerd.
class Cluster {
 public:
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(const ClusterOptions& options);
  Daemon& packer() { return *packer_; }
  Daemon& stager(int node) { return *stagers_[node]; }
  int nodes() const { return static_cast<int>(stagers_.size()); }
  // "127.0.0.1:A,127.0.0.1:B": one stager per node, for tutti-rank-demo.
  std::string StagerList() const;
  // Stops the stagers and the packer (SIGTERM to all, then waits); every one
  // must exit 0.
  absl::Status Stop();

 private:
  std::unique_ptr<Daemon> packer_;
  std::vector<std::unique_ptr<Daemon>> stagers_;
};

// mpirun -np N --oversubscribe argv..., with what Open MPI needs to run as root.
std::vector<std::string> MpirunArgv(int ranks, const std::vector<std::string>& argv);
std::vector<std::string> MpiEnv();

}  // namespace tutti::e2e

#endif  // TUTTI_TESTS_E2E_SUPPORT_H_
