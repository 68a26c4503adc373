// tutti-packerd's flags and what they make: the daemon's options (numeric
// flags range-checked) and the DaemonMain that services/packer/main.cc runs.
#ifndef TUTTI_SERVICES_PACKER_PACKERD_FLAGS_H_
#define TUTTI_SERVICES_PACKER_PACKERD_FLAGS_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/daemon.h"
#include "services/packer/packer_server.h"

namespace tutti::packer {

// The options the parsed flags describe; INVALID_ARGUMENT for a bad value.
absl::StatusOr<PackerServerOptions> PackerOptionsFromFlags();

// --served_plan_precompute: PrecomputeShapes bits ("nodes", "ranks" comma-
// separated, or "none"); INVALID_ARGUMENT naming an unknown part.
absl::StatusOr<uint32_t> PrecomputeShapesFlag(absl::string_view value);

DaemonMain PackerdMain();

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_PACKERD_FLAGS_H_
