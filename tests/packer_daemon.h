// A tutti-packerd process on loopback for tests, and what its tests read
// from it: plans through StreamPlans, metrics over HTTP, a command's output.
#ifndef TUTTI_TESTS_PACKER_DAEMON_H_
#define TUTTI_TESTS_PACKER_DAEMON_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "gtest/gtest.h"
#include "tutti/v1/packer.grpc.pb.h"

namespace tutti {

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One tutti-packerd process.
class Daemon {
 public:
  Daemon(const std::string& dir, const std::string& name, std::vector<std::string> args)
      : out_(dir + "/" + name + ".out"),
        err_(dir + "/" + name + ".err"),
        port_file_(dir + "/" + name + ".ports") {
    std::filesystem::remove(port_file_);
    args.insert(args.begin(), TUTTI_PACKERD);
    args.push_back("--port_file=" + port_file_);
    pid_ = fork();
    if (pid_ == 0) {
      int out = open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(out, 1);
      dup2(err, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Daemon() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  // Waits for the port file (ready) or the process to exit (false).
  bool WaitReady() {
    for (int i = 0; i < 600; ++i) {
      if (std::filesystem::exists(port_file_)) {
        const std::string ports = ReadAll(port_file_);
        if (sscanf(ports.c_str(), "grpc=%d\nmetrics=%d", &grpc_port_, &metrics_port_) == 2) {
          return true;
        }
      }
      if (Exited(0)) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  // Non-blocking (timeout_ms 0) or bounded wait for exit.
  bool Exited(int timeout_ms) {
    for (int waited = 0;; waited += 20) {
      if (exited_) return true;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        status_ = status;
        return true;
      }
      if (waited >= timeout_ms) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  int ExitCode() const { return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1; }
  void Signal(int sig) { kill(pid_, sig); }
  std::string address() const { return absl::StrCat("127.0.0.1:", grpc_port_); }
  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  std::string out() const { return ReadAll(out_); }
  std::string err() const { return ReadAll(err_); }
  std::unique_ptr<v1::Packer::Stub> Stub() const {
    return v1::Packer::NewStub(MakeChannel(address()));
  }

 private:
  std::string out_, err_, port_file_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int status_ = 0;
  int grpc_port_ = 0, metrics_port_ = 0;
};

inline std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  return out;
}

// Plans of [start, end) read through StreamPlans.
inline std::vector<v1::StepPlan> StreamPlans(v1::Packer::Stub* stub, uint64_t start, uint64_t end,
                                             size_t stop_after = SIZE_MAX, uint32_t world = 4) {
  grpc::ClientContext ctx;
  v1::StreamPlansRequest req;
  req.set_start_step(start);
  req.set_end_step(end);
  req.set_world_size(world);
  auto reader = stub->StreamPlans(&ctx, req);
  std::vector<v1::StepPlan> plans;
  v1::StepPlan plan;
  while (plans.size() < stop_after && reader->Read(&plan)) plans.push_back(plan);
  if (plans.size() < stop_after) {
    grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok()) << s.error_message();
  } else {
    ctx.TryCancel();
  }
  return plans;
}

// Runs a command line; its stdout, or "exit N: <stdout>" when it fails.
inline std::string Output(const std::string& command) {
  FILE* f = popen(command.c_str(), "r");
  if (f == nullptr) return "popen failed";
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  const int rc = pclose(f);
  return rc == 0 ? out : absl::StrCat("exit ", rc, ": ", out);
}

}  // namespace tutti

#endif  // TUTTI_TESTS_PACKER_DAEMON_H_
