// absl::Status <-> grpc::Status at the RPC edge.
#ifndef TUTTI_COMMON_GRPC_STATUS_H_
#define TUTTI_COMMON_GRPC_STATUS_H_

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tutti {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context = {});

struct GrpcServerOptions {
  // A Unix-domain socket's mode once bound, and its group (-1: the daemon's
  // own), so that clients of that group may connect.
  unsigned socket_mode = 0660;
  int socket_gid = -1;
  // TLS or insecure (null: insecure); see rpc_security.h.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Largest request gRPC reads; a larger one fails with RESOURCE_EXHAUSTED
  // before any handler runs. Handlers bound their requests below this
  // (RpcGate) with their own message and metric. Default 4 MiB.
  int max_receive_bytes = 4 << 20;
};

// Builds and starts a server listening on `address`: "host:port" (port 0
// picks a free one; *bound_port receives the actual port), or a Unix-domain
// socket "unix:PATH" / "unix:///ABSOLUTE/PATH" (*bound_port receives 0). A
// port in use, or a socket another process still serves on, is reported as
// UNAVAILABLE naming it (and --listen), before gRPC is asked to bind it;
// SO_REUSEPORT is off.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services, int* bound_port,
    const GrpcServerOptions& options = {});

// The keepalive and message-size settings of tutti's channels.
grpc::ChannelArguments DefaultChannelArguments();
// An insecure channel with them (rpc_security.h MakeSecureChannel: TLS,
// token, identity).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

}  // namespace tutti

#endif  // TUTTI_COMMON_GRPC_STATUS_H_
