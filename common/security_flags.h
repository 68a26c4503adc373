// The flags both daemons take for TLS, the job token and request bounds
// (each with an environment fallback, see security_options.h).
#ifndef TUTTI_COMMON_SECURITY_FLAGS_H_
#define TUTTI_COMMON_SECURITY_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/rpc_gate.h"

namespace tutti {

// The flags' values with the environment filled in, checked for `listen`
// (a non-local address without TLS and a token is refused here, as bad
// usage). INVALID_ARGUMENT naming the flag and the fix.
absl::StatusOr<RpcGateOptions> RpcGateOptionsFromFlags(const std::string& listen);

}  // namespace tutti

#endif  // TUTTI_COMMON_SECURITY_FLAGS_H_
