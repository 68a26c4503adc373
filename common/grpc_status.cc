#include "common/grpc_status.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/peer_credentials.h"
#include "common/status.h"

namespace tutti {
namespace {

// The file system path of a "unix:PATH" or "unix:///PATH" address.
std::string UnixPath(const std::string& address) {
  std::string path = address.substr(5);
  if (absl::StartsWith(path, "//")) path = path.substr(2);  // unix://[authority]/path, empty authority
  return path;
}

// True when a process accepts connections on the Unix socket at `path`.
bool SomeoneListens(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

// EADDRINUSE when a TCP "host:port" (port not 0) is taken, else 0: asked
// before gRPC binds, whose own failure is a log line without the fix.
int PortTaken(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return 0;
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (port.empty() || port == "0") return 0;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res) != 0) return 0;
  int taken = 0;
  for (addrinfo* a = res; a != nullptr && taken == 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as gRPC does
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 && errno == EADDRINUSE) taken = EADDRINUSE;
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return taken;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context) {
  if (status.ok()) return absl::OkStatus();
  std::string msg = context.empty() ? status.error_message()
                                    : absl::StrCat(context, ": ", status.error_message());
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), msg);
}

GrpcServer::GrpcServer(std::unique_ptr<grpc::Server> server,
                       std::unique_ptr<UnixSocketListener> unix)
    : server_(std::move(server)), unix_(std::move(unix)) {}

GrpcServer::~GrpcServer() { Shutdown(); }

void GrpcServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  if (shut_down_) return;
  shut_down_ = true;
  // No connection is handed over once gRPC has shut down (it would leak there).
  if (unix_) unix_->Stop();
  server_->Shutdown(deadline);
  unix_.reset();  // closes the socket and removes its file
}

absl::StatusOr<std::unique_ptr<GrpcServer>> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services, int* bound_port,
    const GrpcServerOptions& options) {
  const bool unix_socket = absl::StartsWith(address, "unix:");
  if (!unix_socket && PortTaken(address) == EADDRINUSE) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address, ": the port is in use; stop the other process or pick "
        "another port with --listen"));
  }
  std::unique_ptr<UnixSocketListener> listener;
  if (unix_socket) {
    // A live socket belongs to another daemon; a dead one's file is replaced.
    const std::string path = UnixPath(address);
    if (SomeoneListens(path)) {
      return absl::UnavailableError(absl::StrCat(
          "cannot listen on ", address, ": another process is serving on ", path,
          "; stop it or pick another socket with --listen"));
    }
    UnixSocketListenerOptions lo;
    lo.path = path;
    lo.mode = options.socket_mode;
    lo.gid = options.socket_gid;
    lo.on_refused = options.on_peer_refused;
    ASSIGN_OR_RETURN(listener, UnixSocketListener::Bind(std::move(lo)));
  }
  const std::shared_ptr<grpc::ServerCredentials> creds =
      options.credentials ? options.credentials : grpc::InsecureServerCredentials();
  grpc::ServerBuilder builder;
  int port = 0;
  // SO_REUSEPORT would let two daemons share a port silently; refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // On a Unix socket the daemon accepts, checks the peer's credentials and
  // hands gRPC only the connections it admits.
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor;
  if (unix_socket) {
    acceptor = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, creds);
  } else {
    builder.AddListeningPort(address, creds, &port);
  }
  builder.SetMaxReceiveMessageSize(options.max_receive_bytes);
  builder.SetMaxSendMessageSize(256 << 20);
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || (!unix_socket && port == 0)) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address,
        ": the port is in use or the address is invalid; stop the other process or pick another "
        "port with --listen"));
  }
  if (listener) {
    // The acceptor lives as long as the listener's thread uses it.
    listener->Start([acceptor = std::shared_ptr<grpc::experimental::ExternalConnectionAcceptor>(
                         std::move(acceptor))](int listen_fd, int fd) {
      grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
      p.listener_fd = listen_fd;
      p.fd = fd;
      acceptor->HandleNewConnection(&p);
    });
  }
  if (bound_port) *bound_port = unix_socket ? 0 : port;
  return std::make_unique<GrpcServer>(std::move(server), std::move(listener));
}

grpc::ChannelArguments DefaultChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  return args;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   DefaultChannelArguments());
}

}  // namespace tutti
