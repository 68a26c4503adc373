// Routes gRPC's own log lines (gpr_log) through tutti's log format, so a
// daemon's stderr holds one line format only.
#ifndef TUTTI_COMMON_LOG_GRPC_H_
#define TUTTI_COMMON_LOG_GRPC_H_

namespace tutti {

// Installs the route; call once in main, after ConfigureLogging. gRPC's lines
// appear under the component "grpc" with its source file and line as fields.
void RouteGrpcLogging();

}  // namespace tutti

#endif  // TUTTI_COMMON_LOG_GRPC_H_
