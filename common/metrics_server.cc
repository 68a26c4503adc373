#include "common/metrics_server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <thread>

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

namespace {

// Opens and at once closes a TCP connection to host:port (best effort).
void Knock(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const bool connected = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    ::close(fd);
    if (connected) break;
  }
  ::freeaddrinfo(res);
}

}  // namespace

void StopMetricsServer(std::unique_ptr<prometheus::Exposer> exposer, const std::string& address) {
  if (exposer == nullptr) return;
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::") host = "::1";
  const std::vector<int> ports = exposer->GetListeningPorts();
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    try {
      exposer.reset();
    } catch (const std::exception&) {
      // Nothing is left to serve either way.
    }
    stopped = true;
  });
  // Generous bound: the poll wakes by itself within 2 s anyway.
  for (int i = 0; i < 250 && !stopped; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!stopped) {
      for (int port : ports) Knock(host, port);
    }
  }
  stopper.join();
}

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                               0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                               1,      2.5,     5,      10,    25,     100};
  return kBuckets;
}

}  // namespace tutti
