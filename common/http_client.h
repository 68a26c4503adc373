// A plain HTTP/1.0 GET on loopback, enough to read a daemon's /metrics,
// /healthz or /readyz, and the value of one sample in a Prometheus text
// exposition.
#ifndef TUTTI_COMMON_HTTP_CLIENT_H_
#define TUTTI_COMMON_HTTP_CLIENT_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tutti {

// GET http://127.0.0.1:port<target> (HTTP/1.0); the body, or an error naming
// the port. Bounded by `timeout`.
absl::StatusOr<std::string> HttpGet(int port, const std::string& target,
                                    absl::Duration timeout = absl::Seconds(10));

// The value of the sample line `name` (with labels, exactly as exposed) in a
// Prometheus text exposition; nullopt when absent.
std::optional<double> MetricValue(const std::string& exposition, const std::string& name);

}  // namespace tutti

#endif  // TUTTI_COMMON_HTTP_CLIENT_H_
