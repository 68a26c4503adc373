// A daemon's operational HTTP endpoints, served on its --metrics address:
//   /metrics  every collectable, in the Prometheus text format
//   /healthz  200 "ok" while `live` says OK (the process is alive and serving),
//             else 503 and why
//   /readyz   200 "ready" while `ready` says OK, else 503 with a one-line reason
// An idle or slow client never delays another scrape (http_server.h).
#ifndef TUTTI_COMMON_METRICS_SERVER_H_
#define TUTTI_COMMON_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/collectable.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/http_server.h"
#include "common/latency_buckets.h"  // IWYU pragma: export

namespace tutti {

struct MetricsEndpoints {
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables;
  std::function<absl::Status()> live;   // null: always live
  std::function<absl::Status()> ready;  // null: always ready
};

class MetricsServer {
 public:
  // `address`: "host:port" (port 0 = any free port). A port in use is an
  // UNAVAILABLE error naming it and --metrics. Called on the server's thread.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                               MetricsEndpoints endpoints);
  int port() const { return http_->port(); }
  // The response to one GET (exposed for tests).
  static HttpResponse Answer(const MetricsEndpoints& endpoints, absl::string_view path);

 private:
  explicit MetricsServer(std::unique_ptr<HttpServer> http) : http_(std::move(http)) {}
  std::unique_ptr<HttpServer> http_;
};

}  // namespace tutti

#endif  // TUTTI_COMMON_METRICS_SERVER_H_
