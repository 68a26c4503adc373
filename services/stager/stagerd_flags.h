// tutti-stagerd's flags and what they make: the daemon's options, every
// numeric flag range-checked (an error names the flag and the range), and
// the DaemonMain that services/stager/main.cc runs.
#ifndef TUTTI_SERVICES_STAGER_STAGERD_FLAGS_H_
#define TUTTI_SERVICES_STAGER_STAGERD_FLAGS_H_

#include "absl/status/statusor.h"
#include "common/daemon.h"
#include "services/stager/stager_server.h"

namespace tutti::stager {

// The options the parsed flags describe; INVALID_ARGUMENT for a bad value.
absl::StatusOr<StagerServerOptions> StagerOptionsFromFlags();

DaemonMain StagerdMain();

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_STAGERD_FLAGS_H_
