// tutti-stagerd's lifecycle: fetches the job from the packer, starts the
// core, the gRPC service, the plan stream and the /metrics exposer, and
// shuts them down in order.
#ifndef TUTTI_SERVICES_STAGER_STAGER_SERVER_H_
#define TUTTI_SERVICES_STAGER_STAGER_SERVER_H_

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <prometheus/exposer.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/stager/plan_client.h"
#include "services/stager/stager_core.h"
#include "services/stager/stager_service.h"

namespace tutti::stager {

struct StagerServerOptions {
  std::string packer = "127.0.0.1:7070";   // tutti-packerd address
  std::string listen = "127.0.0.1:7071";   // gRPC address: HOST:PORT (port 0 = any free port)
                                           // or unix:///PATH (a Unix-domain socket)
  std::string metrics = "127.0.0.1:9471";  // /metrics address (port 0 = any free port)
  std::string port_file;                   // if set: "grpc=PORT\nmetrics=PORT\ngrpc_address=A\n"
                                           // written there (PORT 0 for a Unix socket)
  absl::Duration packer_wait = absl::Minutes(10);  // how long to retry GetJob
  StagerOptions core;
};

class StagerServer {
 public:
  explicit StagerServer(StagerServerOptions options);
  ~StagerServer();

  absl::Status Start();
  void Shutdown();  // idempotent

  int grpc_port() const { return grpc_port_; }  // 0 for a Unix socket
  // Where clients connect: HOST:PORT with the bound port, or the unix: address.
  std::string grpc_address() const;
  int metrics_port() const { return metrics_port_; }
  StagerCore* core() { return core_.get(); }

 private:
  StagerServerOptions opts_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<StagerMetrics> metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<StagerCore> core_;
  std::unique_ptr<StagerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<PlanClient> plans_;
  int grpc_port_ = 0, metrics_port_ = 0;
  bool started_ = false;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_STAGER_SERVER_H_
