#include "common/security_flags.h"

#include <cstdint>

#include "absl/flags/flag.h"
#include "common/daemon_flags.h"
#include "common/status.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain to serve TLS with (and, on a stager, to present to the packer "
          "under mutual TLS); env TUTTI_TLS_CERT. Not used on a Unix socket");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert; env TUTTI_TLS_KEY");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificates: verify client certificates (--tls_mutual) and, on a stager, the "
          "packer's; env TUTTI_TLS_CA");
ABSL_FLAG(bool, tls_mutual, false,
          "require a client certificate signed by --tls_ca (mutual TLS); env TUTTI_TLS_MUTUAL=1");
ABSL_FLAG(std::string, tls_client_name, "",
          "with --tls_mutual: the name (CN or SAN) client certificates must carry, e.g. the job "
          "id; env TUTTI_TLS_CLIENT_NAME");
ABSL_FLAG(std::string, token_file, "",
          "file holding the job's token, required on every call (e.g. a mounted Kubernetes "
          "Secret); env TUTTI_TOKEN_FILE, or the token itself in TUTTI_TOKEN");
ABSL_FLAG(uint64_t, max_request_bytes, 64 << 10,
          "largest request accepted, 1K..64M; a larger one is refused RESOURCE_EXHAUSTED");
ABSL_FLAG(uint32_t, max_calls, 16384,
          "calls in flight at once over all clients, 16..1048576; one more is refused "
          "RESOURCE_EXHAUSTED");

namespace tutti {

absl::StatusOr<RpcGateOptions> RpcGateOptionsFromFlags(const std::string& listen) {
  RpcGateOptions o;
  o.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  RETURN_IF_ERROR(CheckFlagRange("max_request_bytes", o.max_request_bytes, 1 << 10, 64 << 20));
  o.max_calls = absl::GetFlag(FLAGS_max_calls);
  RETURN_IF_ERROR(CheckFlagRange("max_calls", o.max_calls, 16, 1 << 20));
  SecurityOptions s;
  s.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  s.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  s.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  s.tls_mutual = absl::GetFlag(FLAGS_tls_mutual);
  s.tls_client_name = absl::GetFlag(FLAGS_tls_client_name);
  s.token_file = absl::GetFlag(FLAGS_token_file);
  ASSIGN_OR_RETURN(o.security, ResolveSecurityOptions(s));
  // Certificates gRPC cannot use are refused here, before anything starts, as
  // bad usage; the warning for an unprotected address is the server's to log.
  auto creds = MakeServerCredentials(o.security, listen, [](const std::string&) {});
  if (!creds.ok()) return absl::InvalidArgumentError(creds.status().message());
  return o;
}

}  // namespace tutti
