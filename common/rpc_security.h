// Who may call a tutti daemon, and how a client proves it: TLS on the gRPC
// endpoints (server certificates, optionally mutual), a per-job token on
// every call, and the rank a client acts as. Configured by file paths and
// environment variables, as Kubernetes Secrets (mounted files, or env from
// secretKeyRef) and a Slurm job's environment provide them.
//
// Off by default (the deploy files and a first try must work without a PKI);
// a daemon serving a TCP address that is not loopback without TLS and a
// token (or mutual TLS) says so in a warning at start, naming the flags.
//
// Thread-safety: the options are values; CallAuthenticator::Check and the
// channel's interceptor may be called from any thread.
#ifndef TUTTI_COMMON_RPC_SECURITY_H_
#define TUTTI_COMMON_RPC_SECURITY_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/security_options.h"

namespace tutti {

// What a daemon serving `listen` uses: TLS credentials (mutual when asked)
// or, without TLS, insecure ones. A non-local address without TLS and a
// token (or mutual TLS) is served, and `warn` is told why it is unsafe and
// which flags fix it. An unreadable certificate or key is INVALID_ARGUMENT.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityOptions& options, const std::string& listen,
    const std::function<void(const std::string&)>& warn);

// Checks what every call to a daemon must carry: the token (when the daemon
// has one) and, with a required client name, the client certificate's name.
class CallAuthenticator {
 public:
  CallAuthenticator() = default;  // checks nothing (no token, no TLS name)
  explicit CallAuthenticator(const SecurityOptions& options);

  // OK, or UNAUTHENTICATED saying what is missing or wrong (never echoing
  // the token).
  absl::Status Check(const grpc::ServerContextBase& ctx) const;
  bool requires_token() const { return !token_.empty(); }

 private:
  std::string token_;
  std::string client_name_;
};

// A channel to `address` with tutti's settings (grpc_status.h MakeChannel)
// and `options`' TLS, whose every call carries the token and, if given, the
// identity.
std::shared_ptr<grpc::Channel> MakeSecureChannel(const std::string& address,
                                                 const SecurityOptions& options,
                                                 const ClientIdentity& identity = {});

// The identity metadata of a call to a daemon: rank -1 when absent. A
// malformed value is INVALID_ARGUMENT.
absl::StatusOr<ClientIdentity> CallIdentity(const grpc::ServerContextBase& ctx);

}  // namespace tutti

#endif  // TUTTI_COMMON_RPC_SECURITY_H_
