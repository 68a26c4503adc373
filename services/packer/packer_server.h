// tutti-packerd's lifecycle: loads the job (config + index), starts the
// plan window, the Packer logic and the gRPC server, writes the port file,
// and shuts everything down in order.
#ifndef TUTTI_SERVICES_PACKER_PACKER_SERVER_H_
#define TUTTI_SERVICES_PACKER_PACKER_SERVER_H_

#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/packer/metrics.h"
#include "services/packer/packer.h"
#include "services/packer/packer_service.h"
#include "services/packer/plan_window.h"

namespace tutti::packer {

struct PackerServerOptions {
  std::string config_path;                // text tutti.v1.JobConfig (required)
  std::string index_path;                 // overrides config.index_path when not empty
  std::string listen = "127.0.0.1:7070";  // gRPC address; port 0 picks a free port
  std::string port_file;                  // when set: "grpc=PORT\nmetrics=PORT\n" after start
  std::string metrics_address;            // as served by the exposer (for the banner)
  int metrics_port = 0;                   // bound metrics port (for the banner and port file)
  uint32_t plan_threads = 2;              // plan-window worker threads
};

class PackerServer {
 public:
  // registry: where the packer's metrics are registered (served by the
  // caller's exposer).
  static absl::StatusOr<std::unique_ptr<PackerServer>> Start(
      const PackerServerOptions& options, std::shared_ptr<prometheus::Registry> registry);
  ~PackerServer();

  // Stops accepting calls, finishes in-flight ones, stops the planners.
  void Shutdown();
  int port() const { return port_; }
  // "tutti-packerd listening on HOST:PORT (metrics HOST:PORT)"
  std::string Banner() const;
  const Job& job() const { return *job_; }

 private:
  PackerServer() = default;

  PackerServerOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<PackerMetrics> metrics_;
  std::shared_ptr<const Job> job_;
  std::unique_ptr<PlanWindow> window_;
  std::unique_ptr<Packer> packer_;
  std::unique_ptr<PackerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

// "host:port" with the port replaced.
std::string WithPort(const std::string& address, int port);

// Blocks SIGINT and SIGTERM in the calling thread (call before starting any
// thread) so that WaitForTerminationSignal receives them.
void BlockTerminationSignals();
// Waits for SIGINT or SIGTERM; returns the signal number.
int WaitForTerminationSignal();

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_PACKER_SERVER_H_
