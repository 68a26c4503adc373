#include "services/packer/packer_server.h"

#include <signal.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "services/packer/load_job.h"

namespace tutti::packer {

absl::StatusOr<std::unique_ptr<PackerServer>> PackerServer::Start(
    const PackerServerOptions& options, std::shared_ptr<prometheus::Registry> registry) {
  std::unique_ptr<PackerServer> s(new PackerServer());
  s->options_ = options;
  s->registry_ = std::move(registry);
  ASSIGN_OR_RETURN(s->job_, LoadJob(options.config_path, options.index_path));
  s->metrics_ = std::make_unique<PackerMetrics>(*s->registry_);
  s->metrics_->index_samples.Set(s->job_->index().num_samples());
  PlanWindowOptions wo;
  wo.window = s->job_->config().plan_window();
  wo.threads = options.plan_threads;
  s->window_ =
      std::make_unique<PlanWindow>(std::make_shared<Planner>(s->job_), wo, s->metrics_.get());
  s->packer_ = std::make_unique<Packer>(s->job_, s->window_.get(), s->metrics_.get());
  s->service_ = std::make_unique<PackerService>(s->packer_.get());
  ASSIGN_OR_RETURN(s->server_, StartGrpcServer(options.listen, {s->service_.get()}, &s->port_));
  if (!options.port_file.empty()) {
    RETURN_IF_ERROR(WriteFileAtomically(
        options.port_file,
        absl::StrCat("grpc=", s->port_, "\nmetrics=", options.metrics_port, "\n")));
  }
  return s;
}

PackerServer::~PackerServer() { Shutdown(); }

void PackerServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (server_) {
    // Calls still running after a second are cancelled (plans take
    // milliseconds; an idle client connection would otherwise hold the
    // shutdown until the deadline).
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  if (window_) window_->Stop();
}

std::string PackerServer::Banner() const {
  return absl::StrCat("tutti-packerd listening on ", WithPort(options_.listen, port_), " (metrics ",
                      WithPort(options_.metrics_address, options_.metrics_port), ")");
}

std::string WithPort(const std::string& address, int port) {
  const size_t colon = address.rfind(':');
  const std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  return absl::StrCat(host, ":", port);
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForTerminationSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

}  // namespace tutti::packer
