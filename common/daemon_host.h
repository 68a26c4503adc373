// What every tutti daemon serves besides its own RPCs, in one place: the
// metrics registry (with process_* and tutti_build_info), the HTTP endpoints
// on the --metrics address (/metrics, /healthz, /readyz: metrics_server.h),
// readiness (readiness.h), the gRPC server with the standard
// grpc.health.v1.Health service reporting that readiness for "" and the
// daemon's service name, and the port file.
//
// The HTTP endpoints come up first, so /healthz and /readyz answer while the
// daemon is still starting (loading its index, waiting for a peer).
//
// Thread-safe, except Start/ServeGrpc/ServeMoreGrpc/Stop, which the daemon's lifecycle calls
// from one thread.
#ifndef TUTTI_COMMON_DAEMON_HOST_H_
#define TUTTI_COMMON_DAEMON_HOST_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/metrics_server.h"
#include "common/readiness.h"

namespace tutti {

struct DaemonHostOptions {
  std::string name;                     // "tutti-stagerd": in logs
  std::string metrics = "127.0.0.1:0";  // HOST:PORT of /metrics, /healthz, /readyz (port 0 = any)
  std::string port_file;                // if set: "metrics=PORT\n" at once, then Serving()
                                        // adds grpc= and grpc_address=
};

class DaemonHost {
 public:
  // Serves the HTTP endpoints at once. A --metrics port in use is UNAVAILABLE.
  static absl::StatusOr<std::unique_ptr<DaemonHost>> Start(DaemonHostOptions options);
  ~DaemonHost();

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }
  Readiness& readiness() { return readiness_; }
  // /healthz: OK while the daemon is alive and serving (default: always).
  void SetLiveness(std::function<absl::Status()> live);
  int metrics_port() const { return metrics_->port(); }
  const DaemonHostOptions& options() const { return options_; }

  // Starts the gRPC server on `address` (see StartGrpcServer) with `services`
  // and the health service, which reports SERVING for "" and `health_name`
  // exactly while the daemon is ready. Readiness gains a last condition,
  // "serving", met by Serving(): the daemon is never ready before its port
  // file names the gRPC port.
  absl::Status ServeGrpc(const std::string& address, const std::vector<grpc::Service*>& services,
                         const std::string& health_name, const GrpcServerOptions& options = {});
  int grpc_port() const { return grpc_port_; }  // 0 for a Unix socket
  // One more gRPC server, on `address` (see StartGrpcServer), with
  // `services` and a health service of its own that reports the same
  // readiness as the first: e.g. a TCP address for other daemons beside a
  // Unix socket for local clients. Call after ServeGrpc, before Serving();
  // returns the bound port (0 for a Unix socket). `name` keys it in the
  // port file: "NAME=PORT\nNAME_address=ADDRESS\n" after the first server's.
  absl::StatusOr<int> ServeMoreGrpc(const std::string& name, const std::string& address,
                                    const std::vector<grpc::Service*>& services,
                                    const GrpcServerOptions& options = {});
  // Where clients connect: HOST:PORT with the bound port, or the unix: address.
  std::string grpc_address() const;
  // The daemon has started: "grpc=PORT\nmetrics=PORT\ngrpc_address=ADDRESS\n"
  // goes to the port file, if set (written atomically: rename), and then the
  // "serving" condition is met. Call after ServeGrpc.
  absl::Status Serving();

  // Health turns NOT_SERVING, then the server stops accepting calls, gives
  // those in flight `grace` and cancels the rest. Idempotent.
  void StopGrpc(absl::Duration grace);
  // StopGrpc(0) and the HTTP endpoints. Idempotent.
  void Stop();

 private:
  explicit DaemonHost(DaemonHostOptions options);
  absl::Status Live() const;
  // The port file, if set: only "metrics=PORT\n" before ServeGrpc.
  absl::Status WritePortFile() const;
  // Every server's health service follows readiness.
  void WatchHealth();

  // A server started by ServeMoreGrpc.
  struct MoreGrpc {
    std::string name;
    std::string address;  // with the bound port
    int port = 0;         // 0 for a Unix socket
    std::unique_ptr<GrpcServer> server;
  };

  const DaemonHostOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  Readiness readiness_;
  mutable absl::Mutex live_mu_;
  std::function<absl::Status()> live_ ABSL_GUARDED_BY(live_mu_);
  std::unique_ptr<MetricsServer> metrics_;
  std::string grpc_listen_;
  std::string health_name_;
  std::unique_ptr<GrpcServer> grpc_;
  int grpc_port_ = 0;
  std::vector<MoreGrpc> more_grpc_;
};

// "host:port" with the port replaced ("unix:..." unchanged).
std::string WithPort(const std::string& address, int port);

}  // namespace tutti

#endif  // TUTTI_COMMON_DAEMON_HOST_H_
