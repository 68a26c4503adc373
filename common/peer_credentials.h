// Who may connect to a daemon's Unix-domain socket, decided per connection
// from what the kernel says about the process at the other end
// (SO_PEERCRED: its pid, uid and gid; SO_PEERGROUPS: its supplementary
// groups), not from the socket file's mode alone: a socket made 0666 by
// mistake, or a directory an operator opened up, still admits only
//   - root and the daemon's own user,
//   - a process whose group or one of whose supplementary groups is the
//     socket's group (--socket_group; default the daemon's own group),
// the same people the stager's batch segments (0640, that group) are
// readable by. Anyone else's connection never reaches gRPC: the listener
// answers every call the client starts on it with PERMISSION_DENIED naming
// the peer's uid (grpc_refusal.h) and closes it, logs a (rate-limited)
// warning naming the peer's uid, gid, groups and pid, and counts it.
//
// UnixSocketListener owns the listening socket: it binds the path, gives it
// its mode and group before it listens, accepts on a thread of its own,
// checks each peer, and hands admitted connections to gRPC
// (grpc::ServerBuilder::experimental().AddExternalConnectionAcceptor).
//
// Thread-safety: CheckPeer is a pure function. Start and Stop are called by
// the one owner; the refusal callback runs on the accepting thread.
#ifndef TUTTI_COMMON_PEER_CREDENTIALS_H_
#define TUTTI_COMMON_PEER_CREDENTIALS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tutti {

// The process at the other end of a connected Unix socket, as it was when
// it connected.
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;              // its effective group
  std::vector<gid_t> groups;  // its supplementary groups
};

// SO_PEERCRED and SO_PEERGROUPS of `fd` (on a kernel without SO_PEERGROUPS
// the groups are read from /proc/<pid>/status). An error names the call.
absl::StatusOr<PeerCredentials> ReadPeerCredentials(int fd);

// Who a socket admits.
struct PeerPolicy {
  uid_t daemon_uid = 0;  // the daemon's effective uid (geteuid())
  gid_t group = 0;       // the socket's group
};

// The policy of a socket with group `gid` (-1: the daemon's effective
// group), for the daemon running now.
PeerPolicy DaemonPeerPolicy(int gid);

// OK when `peer` is root, the daemon's user or in the socket's group (its
// group or a supplementary one); else PERMISSION_DENIED naming the peer's
// uid, gid, groups and pid and who the socket admits.
absl::Status CheckPeer(const PeerCredentials& peer, const PeerPolicy& policy);

struct UnixSocketListenerOptions {
  std::string path;      // the socket file; a stale one (nobody serving) is replaced
  unsigned mode = 0660;  // the socket file's mode
  int gid = -1;          // its group, -1: the daemon's own
  // Told of every refused connection, with the PERMISSION_DENIED status
  // CheckPeer gave (or why its credentials could not be read). May be null.
  std::function<void(const absl::Status&)> on_refused;
};

class UnixSocketListener {
 public:
  // Admitted connections: `fd` is connected, non-blocking and close-on-exec;
  // the callee owns it. `listen_fd` is the listening socket.
  using Admit = std::function<void(int listen_fd, int fd)>;

  // Creates the socket, binds it with the mode and group given (so that it
  // is never reachable with a wider mode) and listens. A path too long for
  // a socket address is INVALID_ARGUMENT; failing to bind, chmod or chown
  // is PERMISSION_DENIED / UNAVAILABLE naming the path and the fix.
  static absl::StatusOr<std::unique_ptr<UnixSocketListener>> Bind(
      UnixSocketListenerOptions options);
  // Stop(), then removes the socket file if it is still this one.
  ~UnixSocketListener();

  // Accepts on a thread of its own from now on.
  void Start(Admit admit);
  // Stops accepting and joins the thread; after it returns `admit` is no
  // longer called. Connections not yet accepted wait in the backlog until
  // the socket is closed. Idempotent.
  void Stop();

  const PeerPolicy& policy() const { return policy_; }

 private:
  UnixSocketListener(UnixSocketListenerOptions options, PeerPolicy policy);
  void AcceptLoop(const Admit& admit);
  void Refuse(const absl::Status& why);

  const UnixSocketListenerOptions options_;
  const PeerPolicy policy_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that ends the accept loop
  dev_t dev_ = 0;     // the socket file bound, to remove only that one
  ino_t ino_ = 0;
  std::thread thread_;
};

}  // namespace tutti

#endif  // TUTTI_COMMON_PEER_CREDENTIALS_H_
