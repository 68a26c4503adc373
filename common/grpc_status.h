// absl::Status <-> grpc::Status at the RPC edge.
#ifndef TUTTI_COMMON_GRPC_STATUS_H_
#define TUTTI_COMMON_GRPC_STATUS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tutti {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context = {});

class UnixSocketListener;

struct GrpcServerOptions {
  // A Unix-domain socket's mode once bound, and its group (-1: the daemon's
  // own), so that clients of that group may connect. Every connection is
  // also checked by its peer's credentials (peer_credentials.h): root, the
  // daemon's user and the members of the socket's group are admitted.
  unsigned socket_mode = 0660;
  int socket_gid = -1;
  // Told of each Unix-socket connection refused by its peer's credentials
  // (PERMISSION_DENIED naming the peer). May be null.
  std::function<void(const absl::Status&)> on_peer_refused;
  // TLS or insecure (null: insecure); see rpc_security.h.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Largest request gRPC reads; a larger one fails with RESOURCE_EXHAUSTED
  // before any handler runs. Handlers bound their requests below this
  // (RpcGate) with their own message and metric. Default 4 MiB.
  int max_receive_bytes = 4 << 20;
};

// A started gRPC server and, on a Unix socket, the listener that checks
// each connection's peer before gRPC sees it.
class GrpcServer {
 public:
  GrpcServer(std::unique_ptr<grpc::Server> server, std::unique_ptr<UnixSocketListener> unix);
  ~GrpcServer();  // Shutdown()

  grpc::Server* server() const { return server_.get(); }
  grpc::Server* operator->() const { return server_.get(); }
  // Stops accepting connections, gives calls in flight until `deadline` and
  // cancels the rest (grpc::Server::Shutdown). Idempotent.
  void Shutdown(std::chrono::system_clock::time_point deadline);
  void Shutdown() { Shutdown(std::chrono::system_clock::now()); }

 private:
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<UnixSocketListener> unix_;
  bool shut_down_ = false;
};

// Builds and starts a server listening on `address`: "host:port" (port 0
// picks a free one; *bound_port receives the actual port), or a Unix-domain
// socket "unix:PATH" / "unix:///ABSOLUTE/PATH" (*bound_port receives 0),
// which the server accepts on itself and admits by peer credentials. A
// port in use, or a socket another process still serves on, is reported as
// UNAVAILABLE naming it (and --listen), before anything is bound;
// SO_REUSEPORT is off.
absl::StatusOr<std::unique_ptr<GrpcServer>> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services, int* bound_port,
    const GrpcServerOptions& options = {});

// The keepalive and message-size settings of tutti's channels.
grpc::ChannelArguments DefaultChannelArguments();
// An insecure channel with them (rpc_security.h MakeSecureChannel: TLS,
// token, identity).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

}  // namespace tutti

#endif  // TUTTI_COMMON_GRPC_STATUS_H_
