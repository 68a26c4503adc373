#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <vector>

#include "client/client.h"
#include "tutti/v1/packer.pb.h"

namespace tutti {
namespace {

using ::testing::HasSubstr;

std::function<const char*(const char*)> Env(std::map<std::string, std::string> vars) {
  auto held = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [held](const char* name) -> const char* {
    auto it = held->find(name);
    return it == held->end() ? nullptr : it->second.c_str();
  };
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(ResolveClientOptions, ReadsTheEnvironment) {
  auto o = ResolveClientOptions({}, Env({{"TUTTI_STAGER", "s:1"},
                                         {"TUTTI_PACKER", "p:2"},
                                         {"OMPI_COMM_WORLD_RANK", "3"},
                                         {"OMPI_COMM_WORLD_SIZE", "4"},
                                         {"TUTTI_START_STEP", "17"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->stager_address, "s:1");
  EXPECT_EQ(o->packer_address, "p:2");
  EXPECT_EQ(o->rank, 3);
  EXPECT_EQ(o->world_size, 4);
  EXPECT_EQ(o->start_step, 17);
  EXPECT_EQ(o->batch_timeout, absl::Seconds(600));
}

TEST(ResolveClientOptions, ExplicitValuesWinAndTuttiRankComesFirst) {
  ClientOptions in;
  in.stager_address = "mine:9";
  auto o = ResolveClientOptions(in, Env({{"TUTTI_STAGER", "s:1"},
                                         {"TUTTI_PACKER", "p:2"},
                                         {"TUTTI_RANK", "1"},
                                         {"OMPI_COMM_WORLD_RANK", "3"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->stager_address, "mine:9");
  EXPECT_EQ(o->rank, 1);
  EXPECT_EQ(o->world_size, -1);  // unknown: the job's is taken
  EXPECT_EQ(o->start_step, 0);
}

TEST(ResolveClientOptions, TorchrunsRankAndTheDefaultStagerSocket) {
  auto no_socket = [](const char*) { return false; };
  auto socket_there = [](const char* path) { return std::string(path) == kDefaultStagerSocket; };
  auto env = Env({{"TUTTI_PACKER", "p:2"},
                  {"RANK", "2"},
                  {"WORLD_SIZE", "4"},
                  {"LOCAL_RANK", "0"},
                  {"SLURM_PROCID", "1"},
                  {"SLURM_NTASKS", "2"}});
  auto o = ResolveClientOptions({}, env, socket_there);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->stager_address, "unix:///var/run/tutti/stager.sock");
  EXPECT_EQ(o->rank, 2);  // torchrun's RANK before Slurm's task id
  EXPECT_EQ(o->world_size, 4);
  auto missing = ResolveClientOptions({}, env, no_socket);
  EXPECT_THAT(Msg(missing.status()), HasSubstr("no stager socket at the default"));
}

TEST(ResolveClientOptions, NamesWhatIsMissingOrWrong) {
  EXPECT_THAT(Msg(ResolveClientOptions({}, Env({})).status()), HasSubstr("TUTTI_STAGER"));
  EXPECT_THAT(Msg(ResolveClientOptions({}, Env({{"TUTTI_STAGER", "s:1"}})).status()),
              HasSubstr("TUTTI_PACKER"));
  EXPECT_THAT(Msg(ResolveClientOptions({}, Env({{"TUTTI_STAGER", "s:1"}, {"TUTTI_PACKER", "p:2"}}))
                      .status()),
              HasSubstr("no rank: set TUTTI_RANK"));
  EXPECT_THAT(
      Msg(ResolveClientOptions(
              {}, Env({{"TUTTI_STAGER", "s:1"}, {"TUTTI_PACKER", "p:2"}, {"TUTTI_RANK", "two"}}))
              .status()),
      HasSubstr("TUTTI_RANK='two' is not a non-negative integer"));
  EXPECT_THAT(Msg(ResolveClientOptions({}, Env({{"TUTTI_STAGER", "s:1"},
                                                {"TUTTI_PACKER", "p:2"},
                                                {"TUTTI_RANK", "4"},
                                                {"TUTTI_WORLD_SIZE", "4"}}))
                      .status()),
              HasSubstr("rank 4 is outside world size 4"));
  ClientOptions bad;
  bad.batch_timeout = absl::ZeroDuration();
  EXPECT_THAT(
      Msg(ResolveClientOptions(
              bad, Env({{"TUTTI_STAGER", "s:1"}, {"TUTTI_PACKER", "p:2"}, {"TUTTI_RANK", "0"}}))
              .status()),
      HasSubstr("batch_timeout must be positive"));
}

v1::JobInfo Job(uint32_t world) {
  v1::JobInfo job;
  job.mutable_config()->set_job_id("vlm-7b");
  job.mutable_config()->set_world_size(world);
  return job;
}

TEST(CheckJobWorldSize, MismatchNamesBothSizesAndTheFix) {
  auto w = CheckJobWorldSize(Job(8), 0, 4);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(w.status()),
              HasSubstr("this client runs with 4 ranks but job 'vlm-7b' was planned for 8"));
  EXPECT_THAT(Msg(w.status()),
              HasSubstr("launch 8 ranks, or restart tutti-packerd with world_size: 4"));
}

TEST(CheckJobWorldSize, AcceptsTheJobsSizeOrAnUnknownOne) {
  EXPECT_EQ(*CheckJobWorldSize(Job(8), 7, 8), 8u);
  EXPECT_EQ(*CheckJobWorldSize(Job(8), 7, -1), 8u);
  EXPECT_THAT(Msg(CheckJobWorldSize(Job(8), 8, -1).status()), HasSubstr("rank 8 is outside"));
  EXPECT_THAT(Msg(CheckJobWorldSize(Job(0), 0, -1).status()), HasSubstr("has no world_size"));
}

// A loopback port nobody listens on.
int ClosedPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(Client, ConnectGivesUpOnAnUnreachablePackerAndSaysWhere) {
  ClientOptions o;
  const std::string packer = "127.0.0.1:" + std::to_string(ClosedPort());
  o.stager_address = "127.0.0.1:1";
  o.packer_address = packer;
  o.rank = 0;
  o.world_size = 1;
  o.connect_timeout = absl::Milliseconds(300);
  o.initial_backoff = absl::Milliseconds(50);
  auto c = Client::Connect(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_THAT(Msg(c.status()),
              HasSubstr("GetJob from tutti-packerd at " + packer + ": gave up after"));
  EXPECT_THAT(Msg(c.status()), HasSubstr("is tutti-packerd running there?"));
}

TEST(Client, ConnectReportsWhatItWaitsForEveryInterval) {
  ClientOptions o;
  const std::string packer = "127.0.0.1:" + std::to_string(ClosedPort());
  o.stager_address = "127.0.0.1:1";
  o.packer_address = packer;
  o.rank = 0;
  o.world_size = 1;
  o.connect_timeout = absl::Milliseconds(1500);
  o.initial_backoff = absl::Milliseconds(50);
  o.max_backoff = absl::Milliseconds(100);
  o.progress_interval = absl::Milliseconds(300);
  std::vector<WaitProgress> seen;
  o.progress = [&](const WaitProgress& p) { seen.push_back(p); };
  EXPECT_FALSE(Client::Connect(o).ok());
  ASSERT_GE(seen.size(), 2u);
  ASSERT_LE(seen.size(), 6u);  // once per interval, not per attempt
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].step, -1);
    EXPECT_THAT(seen[i].waiting_for, HasSubstr("tutti-packerd at " + packer + " is not available"));
    EXPECT_GE(seen[i].waited_seconds, 0.3 * (i + 1) - 1e-3);
  }
  // Without a callback, or with a zero interval, nothing is reported.
  o.progress_interval = absl::ZeroDuration();
  seen.clear();
  EXPECT_FALSE(Client::Connect(o).ok());
  EXPECT_TRUE(seen.empty());
}

TEST(ResolveClientOptions, ProgressIntervalIsZeroOrAtLeastATenthOfASecond) {
  ClientOptions o;
  o.stager_address = "s:1";
  o.packer_address = "p:2";
  o.rank = 0;
  o.progress_interval = absl::Milliseconds(20);
  auto r = ResolveClientOptions(o, Env({}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(r.status()), HasSubstr("progress_interval must be zero"));
  o.progress_interval = absl::Milliseconds(100);
  EXPECT_TRUE(ResolveClientOptions(o, Env({})).ok());
}

}  // namespace
}  // namespace tutti
