#include "services/stager/stager_server.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/grpc_status.h"
#include "common/metrics_server.h"
#include "common/status.h"

namespace tutti::stager {

StagerServer::StagerServer(StagerServerOptions options) : opts_(std::move(options)) {}

StagerServer::~StagerServer() { Shutdown(); }

absl::Status StagerServer::Start() {
  registry_ = std::make_shared<prometheus::Registry>();
  metrics_ = std::make_shared<StagerMetrics>(registry_);
  ASSIGN_OR_RETURN(exposer_, StartMetricsServer(opts_.metrics, registry_, &metrics_port_));
  // Bind the gRPC port before talking to the packer, so a port in use fails at once.
  core_ = std::make_unique<StagerCore>(opts_.core, metrics_);
  service_ = std::make_unique<StagerService>(core_.get());
  ASSIGN_OR_RETURN(server_, StartGrpcServer(opts_.listen, {service_.get()}, &grpc_port_));
  plans_ = std::make_unique<PlanClient>(opts_.packer, metrics_.get());
  ASSIGN_OR_RETURN(v1::JobInfo job, plans_->FetchJob(absl::Now() + opts_.packer_wait));
  RETURN_IF_ERROR(core_->Start(job));
  plans_->Start(core_.get());
  if (!opts_.port_file.empty()) {
    RETURN_IF_ERROR(WriteFileAtomically(
        opts_.port_file, absl::StrCat("grpc=", grpc_port_, "\nmetrics=", metrics_port_,
                                      "\ngrpc_address=", grpc_address(), "\n")));
  }
  started_ = true;
  return absl::OkStatus();
}

std::string StagerServer::grpc_address() const {
  if (absl::StartsWith(opts_.listen, "unix:")) return opts_.listen;
  return absl::StrCat(opts_.listen.substr(0, opts_.listen.rfind(':')), ":", grpc_port_);
}

void StagerServer::Shutdown() {
  if (core_) core_->Stop();  // answers waiting clients with UNAVAILABLE, wakes the plan stream
  if (plans_) plans_->Stop();
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }
  plans_.reset();
  StopMetricsServer(std::move(exposer_), opts_.metrics);
  started_ = false;
}

}  // namespace tutti::stager
