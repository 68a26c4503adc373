#include "common/daemon_host.h"

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/process_metrics.h"
#include "common/status.h"

namespace tutti {
namespace {

constexpr char kServing[] = "serving";

}  // namespace

std::string WithPort(const std::string& address, int port) {
  if (absl::StartsWith(address, "unix:")) return address;
  const size_t colon = address.rfind(':');
  const std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  return absl::StrCat(host, ":", port);
}

DaemonHost::DaemonHost(DaemonHostOptions options)
    : options_(std::move(options)), registry_(std::make_shared<prometheus::Registry>()) {}

absl::StatusOr<std::unique_ptr<DaemonHost>> DaemonHost::Start(DaemonHostOptions options) {
  std::unique_ptr<DaemonHost> host(new DaemonHost(std::move(options)));
  MetricsEndpoints endpoints;
  endpoints.collectables = {host->registry_, std::make_shared<ProcessMetrics>()};
  DaemonHost* h = host.get();
  endpoints.live = [h] { return h->Live(); };
  endpoints.ready = [h] { return h->readiness_.Check(); };
  auto metrics = MetricsServer::Start(host->options_.metrics, std::move(endpoints));
  if (!metrics.ok()) return metrics.status();
  host->metrics_ = std::move(*metrics);
  // Probes may begin at once: the metrics port is known before the daemon serves.
  RETURN_IF_ERROR(host->WritePortFile());
  return host;
}

DaemonHost::~DaemonHost() { Stop(); }

void DaemonHost::SetLiveness(std::function<absl::Status()> live) {
  absl::MutexLock l(&live_mu_);
  live_ = std::move(live);
}

absl::Status DaemonHost::Live() const {
  absl::MutexLock l(&live_mu_);
  return live_ ? live_() : absl::OkStatus();
}

absl::Status DaemonHost::ServeGrpc(const std::string& address,
                                   const std::vector<grpc::Service*>& services,
                                   const std::string& health_name,
                                   const GrpcServerOptions& options) {
  grpc::EnableDefaultHealthCheckService(true);
  auto server = StartGrpcServer(address, services, &grpc_port_, options);
  if (!server.ok()) return server.status();
  grpc_ = std::move(*server);
  grpc_listen_ = address;
  health_name_ = health_name;
  readiness_.Require(kServing, "starting to serve");
  WatchHealth();
  return absl::OkStatus();
}

absl::StatusOr<int> DaemonHost::ServeMoreGrpc(const std::string& name, const std::string& address,
                                              const std::vector<grpc::Service*>& services,
                                              const GrpcServerOptions& options) {
  if (!grpc_) return absl::FailedPreconditionError("ServeMoreGrpc() before ServeGrpc()");
  int port = 0;
  auto server = StartGrpcServer(address, services, &port, options);
  if (!server.ok()) return server.status();
  more_grpc_.push_back({name, WithPort(address, port), port, std::move(*server)});
  WatchHealth();
  return port;
}

void DaemonHost::WatchHealth() {
  std::vector<grpc::HealthCheckServiceInterface*> healths;
  if (grpc_) healths.push_back(grpc_->server()->GetHealthCheckService());
  for (const MoreGrpc& more : more_grpc_) {
    healths.push_back(more.server->server()->GetHealthCheckService());
  }
  std::erase(healths, nullptr);
  if (healths.empty()) return;
  readiness_.Watch([healths, health_name = health_name_](bool ready) {
    for (grpc::HealthCheckServiceInterface* health : healths) {
      health->SetServingStatus(ready);  // "" and every service
      health->SetServingStatus(health_name, ready);
    }
  });
}

std::string DaemonHost::grpc_address() const { return WithPort(grpc_listen_, grpc_port_); }

absl::Status DaemonHost::WritePortFile() const {
  if (options_.port_file.empty()) return absl::OkStatus();
  if (!grpc_) {
    return WriteFileAtomically(options_.port_file, absl::StrCat("metrics=", metrics_port(), "\n"));
  }
  std::string text = absl::StrCat("grpc=", grpc_port_, "\nmetrics=", metrics_port(),
                                  "\ngrpc_address=", grpc_address(), "\n");
  for (const MoreGrpc& more : more_grpc_) {
    absl::StrAppend(&text, more.name, "=", more.port, "\n", more.name, "_address=", more.address,
                    "\n");
  }
  return WriteFileAtomically(options_.port_file, text);
}

absl::Status DaemonHost::Serving() {
  if (!grpc_) return absl::FailedPreconditionError("Serving() before ServeGrpc()");
  RETURN_IF_ERROR(WritePortFile());
  readiness_.Set(kServing, absl::OkStatus());
  return absl::OkStatus();
}

void DaemonHost::StopGrpc(absl::Duration grace) {
  readiness_.ShuttingDown();
  if (!grpc_) return;
  readiness_.Watch(nullptr);  // the health services go with the servers
  const auto deadline = std::chrono::system_clock::now() + absl::ToChronoNanoseconds(grace);
  for (MoreGrpc& more : more_grpc_) more.server->Shutdown(deadline);
  grpc_->Shutdown(deadline);
  more_grpc_.clear();
  grpc_.reset();
}

void DaemonHost::Stop() {
  StopGrpc(absl::ZeroDuration());
  metrics_.reset();
}

}  // namespace tutti
