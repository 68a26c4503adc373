// Serving /metrics for a daemon's prometheus-cpp registry.
#ifndef TUTTI_COMMON_METRICS_SERVER_H_
#define TUTTI_COMMON_METRICS_SERVER_H_

#include <memory>
#include <string>

#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include "absl/status/statusor.h"

namespace tutti {

// Starts an HTTP exposer on `address` ("host:port", port 0 = any) serving
// `registry` at /metrics. A port in use is an UNAVAILABLE error naming it.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetricsServer(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry, int* bound_port);

// Stops and destroys `exposer` (started on `address` by StartMetricsServer)
// within milliseconds. civetweb's listener thread only sees the stop request
// when its poll of the listening socket returns (every 2 s when idle), so
// while the exposer stops, connections that close at once are made to its
// listening ports to wake that poll; a connection accepted before the stop
// reads end-of-file and ends. Safe to call with null.
void StopMetricsServer(std::unique_ptr<prometheus::Exposer> exposer, const std::string& address);

// Histogram buckets for latencies from 100 us to ~100 s.
const std::vector<double>& LatencyBuckets();

}  // namespace tutti

#endif  // TUTTI_COMMON_METRICS_SERVER_H_
