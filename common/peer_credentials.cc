#include "common/peer_credentials.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/grpc_refusal.h"
#include "common/log.h"

namespace tutti {
namespace {

const Logger kLog("rpc.unix_socket");

// Refused connections answered at once (more are closed at once), and for
// how long each is answered before it is closed.
constexpr size_t kMaxRefusing = 64;
constexpr absl::Duration kRefusalTime = absl::Seconds(5);

std::string Errno(int e) { return std::strerror(e); }

// All of `bytes` to a non-blocking socket; false when it fails or would block
// (a refusal is a few hundred bytes to a fresh connection).
bool WriteAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Reads what the peer sent last (up to a bound) before closing: a Unix
// socket closed with unread data resets its peer, which could then miss the
// answer written to it.
void DrainAndClose(int fd) {
  char buf[4096];
  for (int i = 0; i < 16 && ::recv(fd, buf, sizeof(buf), 0) > 0; ++i) {
  }
  ::close(fd);
}

// The "Groups:" line of /proc/<pid>/status, for kernels without
// SO_PEERGROUPS (before 4.13).
absl::StatusOr<std::vector<gid_t>> ProcGroups(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest(line);
    if (!absl::ConsumePrefix(&rest, "Groups:")) continue;
    std::vector<gid_t> groups;
    for (absl::string_view g : absl::StrSplit(rest, absl::ByAnyChar(" \t"), absl::SkipEmpty())) {
      uint32_t v = 0;
      if (absl::SimpleAtoi(g, &v)) groups.push_back(v);
    }
    return groups;
  }
  return absl::UnavailableError(absl::StrCat("/proc/", pid, "/status has no Groups line"));
}

}  // namespace

absl::StatusOr<PeerCredentials> ReadPeerCredentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred)) {
    return absl::UnavailableError(absl::StrCat("SO_PEERCRED: ", Errno(errno)));
  }
  PeerCredentials peer;
  peer.pid = cred.pid;
  peer.uid = cred.uid;
  peer.gid = cred.gid;
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 4; ++attempt) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      peer.groups = std::move(groups);
      return peer;
    }
    if (errno == ERANGE) {  // `bytes` says how many are needed
      groups.resize(bytes / sizeof(gid_t) + 1);
      continue;
    }
    if (errno == ENOPROTOOPT) {
      auto from_proc = ProcGroups(peer.pid);
      if (!from_proc.ok()) return from_proc.status();
      peer.groups = *std::move(from_proc);
      return peer;
    }
    return absl::UnavailableError(absl::StrCat("SO_PEERGROUPS: ", Errno(errno)));
  }
  return absl::UnavailableError("SO_PEERGROUPS: the peer's groups kept growing");
}

PeerPolicy DaemonPeerPolicy(int gid) {
  PeerPolicy p;
  p.daemon_uid = ::geteuid();
  p.group = gid >= 0 ? static_cast<gid_t>(gid) : ::getegid();
  return p;
}

absl::Status CheckPeer(const PeerCredentials& peer, const PeerPolicy& policy) {
  if (peer.uid == 0 || peer.uid == policy.daemon_uid) return absl::OkStatus();
  if (peer.gid == policy.group ||
      std::find(peer.groups.begin(), peer.groups.end(), policy.group) != peer.groups.end()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "uid ", peer.uid, " (gid ", peer.gid, ", groups ",
      peer.groups.empty() ? "none" : absl::StrJoin(peer.groups, ","), ", pid ", peer.pid,
      ") may not use this socket: it admits root",
      policy.daemon_uid == 0 ? std::string()
                             : absl::StrCat(", uid ", policy.daemon_uid, " (the daemon's user)"),
      " and the members of group ", policy.group,
      " (the socket's group, --socket_group); run the client with that group (e.g. in a pod's "
      "supplementalGroups)"));
}

UnixSocketListener::UnixSocketListener(UnixSocketListenerOptions options, PeerPolicy policy)
    : options_(std::move(options)), policy_(std::move(policy)) {}

absl::StatusOr<std::unique_ptr<UnixSocketListener>> UnixSocketListener::Bind(
    UnixSocketListenerOptions options) {
  const std::string path = options.path;
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the socket path '", path, "' must have 1 to ", sizeof(addr.sun_path) - 1,
                     " characters; pick a shorter one with --listen"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  PeerPolicy policy = DaemonPeerPolicy(options.gid);
  std::unique_ptr<UnixSocketListener> l(new UnixSocketListener(std::move(options), policy));
  l->listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  l->wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (l->listen_fd_ < 0 || l->wake_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create the socket ", path, ": ", Errno(errno)));
  }
  // A socket file left by a daemon that is gone (the caller checked that
  // nobody serves on it) is replaced; anything else at the path is kept.
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(path.c_str());
  if (::bind(l->listen_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int e = errno;
    return absl::UnavailableError(
        absl::StrCat("cannot listen on unix:", path, ": ", Errno(e),
                     e == EADDRINUSE ? " (a file that is not a socket is in the way)"
                                     : " (does its directory exist and is it writable?)",
                     "; pick another path with --listen"));
  }
  // Mode and group before listen(): until then nobody can connect.
  const UnixSocketListenerOptions& o = l->options_;
  if (::chmod(path.c_str(), o.mode) != 0 ||
      (o.gid >= 0 &&
       ::chown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(o.gid)) != 0)) {
    const int e = errno;
    ::unlink(path.c_str());
    return absl::PermissionDeniedError(
        absl::StrCat("cannot give the socket ", path, " mode ", absl::StrFormat("%04o", o.mode),
                     o.gid >= 0 ? absl::StrCat(" and group ", o.gid) : "", ": ", Errno(e),
                     "; the daemon must belong to the group given with --socket_group"));
  }
  if (::stat(path.c_str(), &st) == 0) {
    l->dev_ = st.st_dev;
    l->ino_ = st.st_ino;
  }
  if (::listen(l->listen_fd_, SOMAXCONN) != 0) {
    const int e = errno;
    ::unlink(path.c_str());
    return absl::UnavailableError(absl::StrCat("cannot listen on unix:", path, ": ", Errno(e)));
  }
  return l;
}

UnixSocketListener::~UnixSocketListener() {
  Stop();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  struct stat st {};
  if (ino_ != 0 && ::lstat(options_.path.c_str(), &st) == 0 && st.st_dev == dev_ &&
      st.st_ino == ino_) {
    ::unlink(options_.path.c_str());
  }
}

void UnixSocketListener::Start(Admit admit) {
  if (thread_.joinable()) return;
  thread_ = std::thread([this, admit = std::move(admit)] { AcceptLoop(admit); });
}

void UnixSocketListener::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  thread_.join();
}

void UnixSocketListener::Refuse(const absl::Status& why) {
  static LogRateLimit limit(absl::Seconds(10), 10);
  if (uint64_t suppressed = 0; limit.Allow(&suppressed)) {
    kLog.Warning("connection refused by its peer's credentials",
                 {{"socket", options_.path}, {"why", why.message()}, {"suppressed", suppressed}});
  }
  if (options_.on_refused) options_.on_refused(why);
}

void UnixSocketListener::AcceptLoop(const Admit& admit) {
  // Refused connections being told so (grpc_refusal.h), each for a while.
  struct Refusing {
    int fd;
    absl::Time deadline;
    GrpcRefusal talk;
  };
  std::vector<std::unique_ptr<Refusing>> refusing;
  int pause_ms = -1;  // after running out of descriptors: wait before accepting again
  for (;;) {
    std::vector<pollfd> fds = {{wake_fd_, POLLIN, 0}};
    const bool accepting = pause_ms < 0;
    if (accepting) fds.push_back({listen_fd_, POLLIN, 0});
    const size_t first_refusing = fds.size();
    int timeout_ms = pause_ms;
    for (const auto& c : refusing) {
      fds.push_back({c->fd, POLLIN, 0});
      const int ms = static_cast<int>(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(c->deadline - absl::Now()) + 1));
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      kLog.Error("poll on the socket failed; no longer accepting",
                 {{"socket", options_.path}, {"error", Errno(errno)}});
      break;
    }
    if (fds[0].revents != 0) break;  // Stop()
    pause_ms = -1;
    const absl::Time now = absl::Now();
    std::vector<std::unique_ptr<Refusing>> still;
    for (size_t i = 0; i < refusing.size(); ++i) {
      Refusing& c = *refusing[i];
      bool done = now >= c.deadline;
      if (!done && fds[first_refusing + i].revents != 0) {
        char buf[16 << 10];
        const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
        if (n > 0) {
          const std::string reply = c.talk.Feed(absl::string_view(buf, n));
          done = (!reply.empty() && !WriteAll(c.fd, reply)) || c.talk.finished() || c.talk.failed();
        } else {
          done = n == 0 || (errno != EAGAIN && errno != EINTR);
        }
      }
      if (done) {
        DrainAndClose(c.fd);
      } else {
        still.push_back(std::move(refusing[i]));
      }
    }
    refusing = std::move(still);
    if (!accepting || fds[1].revents == 0) continue;
    for (;;) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        const int e = errno;
        if (e == EINTR || e == ECONNABORTED) continue;
        if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
          static LogRateLimit limit(absl::Seconds(10), 1);
          if (uint64_t suppressed = 0; limit.Allow(&suppressed)) {
            kLog.Warning(
                "cannot accept a connection; retrying",
                {{"socket", options_.path}, {"error", Errno(e)}, {"suppressed", suppressed}});
          }
          pause_ms = 100;
        }
        break;  // EAGAIN: the backlog is empty
      }
      absl::StatusOr<PeerCredentials> peer = ReadPeerCredentials(fd);
      absl::Status admitted =
          peer.ok() ? CheckPeer(*peer, policy_)
                    : absl::PermissionDeniedError(absl::StrCat(
                          "the peer's credentials cannot be read: ", peer.status().message()));
      if (admitted.ok()) {
        admit(listen_fd_, fd);
        continue;
      }
      Refuse(admitted);
      auto c = std::make_unique<Refusing>(
          Refusing{fd, absl::Now() + kRefusalTime, GrpcRefusal(admitted)});
      if (refusing.size() < kMaxRefusing && WriteAll(fd, c->talk.Greeting())) {
        refusing.push_back(std::move(c));
      } else {
        ::close(fd);  // too many at once: closed without a word
      }
    }
  }
  for (const auto& c : refusing) ::close(c->fd);
}

}  // namespace tutti
