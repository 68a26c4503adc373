#include "common/peer_credentials.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  std::string t = ::testing::TempDir() + "/peercred_" + name + "_XXXXXX";
  EXPECT_NE(::mkdtemp(t.data()), nullptr);
  return t;
}

// Connects to the socket at `path`; the fd, or -1.
int Connect(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(PeerCredentials, AConnectedSocketNamesTheProcessAtTheOtherEnd) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  auto peer = ReadPeerCredentials(fds[0]);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(peer->pid, ::getpid());
  EXPECT_EQ(peer->uid, ::geteuid());
  EXPECT_EQ(peer->gid, ::getegid());
  std::vector<gid_t> mine(::getgroups(0, nullptr));
  ASSERT_EQ(::getgroups(static_cast<int>(mine.size()), mine.data()), static_cast<int>(mine.size()));
  EXPECT_THAT(peer->groups, ::testing::UnorderedElementsAreArray(mine));
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST(PeerCredentials, AdmitsRootTheDaemonsUserAndTheSocketsGroup) {
  const PeerPolicy policy{.daemon_uid = 1000, .group = 2000};
  EXPECT_TRUE(CheckPeer({.pid = 1, .uid = 0, .gid = 0}, policy).ok());
  EXPECT_TRUE(CheckPeer({.pid = 1, .uid = 1000, .gid = 1000}, policy).ok());
  EXPECT_TRUE(CheckPeer({.pid = 1, .uid = 1500, .gid = 2000}, policy).ok());
  EXPECT_TRUE(CheckPeer({.pid = 1, .uid = 1500, .gid = 1500, .groups = {7, 2000}}, policy).ok());
  const absl::Status refused =
      CheckPeer({.pid = 4242, .uid = 1500, .gid = 1501, .groups = {7, 8}}, policy);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.message(), HasSubstr("uid 1500 (gid 1501, groups 7,8, pid 4242)"));
  EXPECT_THAT(refused.message(), HasSubstr("uid 1000 (the daemon's user)"));
  EXPECT_THAT(refused.message(), HasSubstr("members of group 2000"));
  EXPECT_THAT(CheckPeer({.pid = 1, .uid = 5, .gid = 5}, {.daemon_uid = 0, .group = 2000}).message(),
              HasSubstr("it admits root and the members of group 2000"));
}

TEST(UnixSocketListener, BindsWithItsModeAndGroupAndHandsOverAdmittedConnections) {
  const std::string dir = TempDir("bind");
  const std::string path = dir + "/s.sock";
  {  // a socket file left behind by a daemon that is gone
    auto stale = UnixSocketListener::Bind({.path = path});
    ASSERT_TRUE(stale.ok()) << stale.status();
  }
  ASSERT_EQ(::symlink("/nonexistent", path.c_str()), 0);  // not even a socket: not replaced
  EXPECT_FALSE(UnixSocketListener::Bind({.path = path}).ok());
  ASSERT_EQ(::unlink(path.c_str()), 0);

  auto l = UnixSocketListener::Bind({.path = path, .mode = 0640});
  ASSERT_TRUE(l.ok()) << l.status();
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_EQ(st.st_gid, ::getegid());
  absl::Notification admitted;
  (*l)->Start([&](int listen_fd, int fd) {
    EXPECT_GE(listen_fd, 0);
    ::close(fd);
    admitted.Notify();
  });
  const int fd = Connect(path);
  ASSERT_GE(fd, 0);
  admitted.WaitForNotification();
  ::close(fd);
  l->reset();
  EXPECT_NE(::lstat(path.c_str(), &st), 0) << "the socket file outlives its listener";
  ::rmdir(dir.c_str());
}

TEST(UnixSocketListener, RefusesAnotherUserEvenThroughAWorldWritableSocket) {
  if (::geteuid() != 0) GTEST_SKIP() << "connecting as another user needs root";
  const std::string dir = TempDir("refuse");
  ::chmod(dir.c_str(), 0755);
  const std::string path = dir + "/s.sock";
  absl::Mutex mu;
  std::vector<absl::Status> refusals;
  int admitted = 0;
  auto l = UnixSocketListener::Bind(
      {.path = path, .mode = 0666, .gid = 54323, .on_refused = [&](const absl::Status& s) {
         absl::MutexLock lock(&mu);
         refusals.push_back(s);
       }});
  ASSERT_TRUE(l.ok()) << l.status();
  (*l)->Start([&](int, int fd) {
    ::close(fd);
    absl::MutexLock lock(&mu);
    ++admitted;
  });
  // Children that drop to uid 54321 in no admitted group and to uid 54322
  // with the socket's group as a supplementary one, and connect.
  for (const uid_t uid : {54321u, 54322u}) {
    const pid_t child = ::fork();
    if (child == 0) {
      const gid_t socket_group = 54323;
      if (::setgroups(uid == 54322 ? 1 : 0, &socket_group) != 0 || ::setgid(54321) != 0 ||
          ::setuid(uid) != 0) {
        _exit(3);
      }
      _exit(Connect(path) >= 0 ? 0 : 4);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0) << "uid " << uid << " could not connect";
  }
  auto both_seen = [&] { return refusals.size() + admitted == 2; };
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&both_seen));
    ASSERT_EQ(refusals.size(), 1u);
    EXPECT_EQ(refusals[0].code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(refusals[0].message(), HasSubstr("uid 54321 (gid 54321"));
    EXPECT_EQ(admitted, 1);
  }
  l->reset();
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace tutti
