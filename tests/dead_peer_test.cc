// A rank that dies before an exchange: the others end with a clear error in
// bounded time, never hang. Runs tests/dead_peer_rank.cc under mpirun twice:
//   - as Open MPI does by default, mpirun aborts the job when a rank exits
//     without MPI_Finalize: it must end promptly, naming the rank;
//   - with --enable-recovery the job goes on: every survivor's exchange must
//     fail with DEADLINE_EXCEEDED naming the dead rank (the agreement's
//     join_timeout of 2 s, then a roll call of as long), and the survivors
//     then end the job through FinishMpi (MPI_Abort, code 3 when the rank
//     was named) rather than wait in MPI_Finalize for the dead rank.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace {

struct JobRun {
  int status = -1;  // exit status; -1 when it had to be killed
  double seconds = 0;
  std::string output;
};

// Runs argv with stdout and stderr captured; kills it after `limit_s`.
JobRun RunWithLimit(std::vector<std::string> argv, double limit_s) {
  int pipefd[2];
  EXPECT_EQ(pipe(pipefd), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    close(pipefd[0]);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(pipefd[1]);
  fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
  JobRun r;
  char buf[4096];
  int status = 0;
  bool exited = false;
  while (!exited) {
    ssize_t n;
    while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) r.output.append(buf, n);
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      break;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit_s) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.output += "\n[killed after the time limit]\n";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) r.output.append(buf, n);
  close(pipefd[0]);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (exited && WIFEXITED(status)) r.status = WEXITSTATUS(status);
  return r;
}

std::vector<std::string> Mpirun(bool recovery) {
  std::vector<std::string> argv = {TUTTI_MPIEXEC, "-np", "4", "--oversubscribe"};
  if (recovery) argv.push_back("--enable-recovery");
  argv.push_back(TUTTI_DEAD_PEER_RANK);
  return argv;
}

class DeadPeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
};

TEST_F(DeadPeerTest, SurvivorsReportTheDeadRankWithinTheTimeout) {
  const JobRun r = RunWithLimit(Mpirun(true), 40);
  ASSERT_NE(r.status, -1) << "the job hung:\n" << r.output;
  // The survivors end the job (mpirun's own exit status under
  // --enable-recovery says little: it is 0 or the abort code).
  EXPECT_NE(r.output.find("aborting the MPI job (code 3)"), std::string::npos) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string line = "rank " + std::to_string(rank) + ": DEADLINE_EXCEEDED";
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
  EXPECT_NE(r.output.find("rank(s) 3 did not join the exchange within 2s"), std::string::npos)
      << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
}

TEST_F(DeadPeerTest, MpirunByDefaultEndsTheJobNamingTheRank) {
  const JobRun r = RunWithLimit(Mpirun(false), 40);
  ASSERT_NE(r.status, -1) << "the job hung:\n" << r.output;
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("process rank 3"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
}

}  // namespace
