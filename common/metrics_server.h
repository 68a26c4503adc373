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

// Histogram buckets for latencies from 100 us to ~100 s.
const std::vector<double>& LatencyBuckets();

}  // namespace tutti

#endif  // TUTTI_COMMON_METRICS_SERVER_H_
