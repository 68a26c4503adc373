// What decides who may call a tutti daemon, as operators give it: TLS
// certificate files, a per-job token (a file or the environment, as
// Kubernetes Secrets and a Slurm job's environment provide them), and the
// identity a client sends with its calls. Plain values, no gRPC: the gRPC
// side is common/rpc_security.h.
#ifndef TUTTI_COMMON_SECURITY_OPTIONS_H_
#define TUTTI_COMMON_SECURITY_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tutti {

// Metadata keys of a call.
inline constexpr char kAuthorizationKey[] = "authorization";  // "Bearer <token>"
inline constexpr char kRankKey[] = "tutti-rank";              // the rank a client acts as
inline constexpr char kJobKey[] = "tutti-job";                // the job id it belongs to

// In a stager's NOT_FOUND answer to a call naming an incarnation it never
// issued (it restarted since the process registered): register again.
inline constexpr char kUnknownIncarnation[] = "was not issued by this stager";

struct SecurityOptions {
  // TLS. A daemon serves TLS when cert and key are given; a client speaks
  // TLS when a CA is given (verifying the daemon's certificate) and presents
  // cert and key, when given, for mutual TLS.
  std::string tls_cert_file;  // PEM certificate chain. Env TUTTI_TLS_CERT
  std::string tls_key_file;   // PEM private key of it. Env TUTTI_TLS_KEY
  std::string tls_ca_file;    // PEM CA certificates. Env TUTTI_TLS_CA
  // Daemon: require a client certificate signed by tls_ca_file. Env
  // TUTTI_TLS_MUTUAL=1. Default off.
  bool tls_mutual = false;
  // Daemon with tls_mutual: the client certificate must also name this
  // (common name or a subject alternative name), e.g. the job id when one
  // CA signs the certificates of several jobs. Empty: any the CA signed.
  // Env TUTTI_TLS_CLIENT_NAME.
  std::string tls_client_name;
  // Client: the name the daemon's certificate must carry when it is not the
  // address's host (an IP address, a Service name). Env TUTTI_TLS_SERVER_NAME.
  std::string tls_server_name;
  // The per-job token every call carries and every daemon checks: read from
  // token_file (env TUTTI_TOKEN_FILE; a mounted Secret) or given as token
  // (env TUTTI_TOKEN; a Slurm job's environment). Empty: no token.
  std::string token_file;
  std::string token;

  bool tls_server() const { return !tls_cert_file.empty(); }
  bool tls_client() const { return !tls_ca_file.empty(); }
};

// Fills unset fields from the environment (names above), reads the token
// file, and checks the combination: a certificate needs its key, mutual TLS
// needs a CA and a certificate, files must be readable. INVALID_ARGUMENT
// naming the setting and the fix. `getenv` is injectable for tests.
absl::StatusOr<SecurityOptions> ResolveSecurityOptions(
    SecurityOptions options, const std::function<const char*(const char*)>& getenv = nullptr);

// The contents of a PEM file; INVALID_ARGUMENT naming `what` and the path
// when it cannot be read or holds no PEM block. A `secret` (a private key)
// is read with ReadSecretFile's check.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const char* what,
                                        bool secret = false);

// The contents of a file holding a secret (the token, a private key).
// INVALID_ARGUMENT naming `what`, the path and the fix when other users may
// read or write it (any of the mode's "other" bits, as ssh refuses such a
// private key): whoever reads the token acts as any rank of the job. Group
// access is allowed: the job's group shares the token, as it shares the
// stager's socket. At most 1 MiB.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const char* what);

// "unix:..." or a loopback host (127.0.0.0/8, ::1, localhost).
bool IsLocalAddress(absl::string_view address);

// Who a client is, sent with each of its calls (kRankKey, kJobKey). rank < 0:
// not a rank (a stager fetching plans, a tool).
struct ClientIdentity {
  int64_t rank = -1;
  std::string job_id;
};

}  // namespace tutti

#endif  // TUTTI_COMMON_SECURITY_OPTIONS_H_
