#include "common/metrics_server.h"

#include <exception>

#include "absl/strings/str_cat.h"

namespace tutti {

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetricsServer(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry, int* bound_port) {
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address, ": ", e.what(),
                                               "; the port is in use or the address is invalid; "
                                               "pick another with --metrics"));
  }
  exposer->RegisterCollectable(registry);
  auto ports = exposer->GetListeningPorts();
  if (bound_port) *bound_port = ports.empty() ? 0 : ports.front();
  return exposer;
}

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                               0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                               1,      2.5,     5,      10,    25,     100};
  return kBuckets;
}

}  // namespace tutti
