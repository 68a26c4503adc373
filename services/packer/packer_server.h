// tutti-packerd's lifecycle: serves the operational endpoints first
// (daemon_host.h), loads the job (config + index), starts the plan window,
// the Packer logic and the gRPC server, and is ready (/readyz, gRPC health)
// once the index is loaded and the first plan is computed. Shuts everything
// down in order.
#ifndef TUTTI_SERVICES_PACKER_PACKER_SERVER_H_
#define TUTTI_SERVICES_PACKER_PACKER_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/daemon.h"
#include "common/daemon_host.h"
#include "common/rank_identity.h"
#include "common/rpc_gate.h"
#include "services/packer/core/cost_schedule.h"
#include "services/packer/core/job.h"
#include "services/packer/cost_fit_record.h"
#include "services/packer/locality_monitor.h"
#include "services/packer/locality_record.h"
#include "services/packer/metrics.h"
#include "services/packer/packer.h"
#include "services/packer/packer_service.h"
#include "services/packer/plan_window.h"

namespace tutti::packer {

struct PackerServerOptions {
  std::string config_path;                 // text tutti.v1.JobConfig (required)
  std::string index_path;                  // overrides config.index_path when not empty
  std::string listen = "127.0.0.1:7070";   // gRPC address; port 0 picks a free port
  std::string metrics = "127.0.0.1:9470";  // /metrics, /healthz, /readyz; port 0 picks a free port
  std::string port_file;                   // when set: "grpc=PORT\nmetrics=PORT\n..." after start
  uint32_t plan_threads = 2;               // plan-window worker threads
  // StreamPlans open at once per client connection (packer_service.h).
  uint32_t max_streams_per_client = kDefaultMaxStreamsPerClient;
  // Serialized plans kept to serve again (served_plans.h).
  ServedPlansOptions served;
  RpcGateOptions rpc;  // TLS, token, request bounds (rpc_gate.h)
  // The online cost fits' record (cost_fit_record.h): read at start, so the
  // steps are planned as before a restart, and kept as fits are announced.
  // Required when the job's cost.online_fit is enabled; empty otherwise.
  std::string cost_fit_record;
  // How the job is planned besides its config: node removals with locality
  // (JobOptions::node_removals, --node_removals). Default none.
  JobOptions job;
  // With locality: the record of the node changes announced from the
  // stagers' reports (locality_record.h), read at start and kept; empty:
  // the reports are not acted on (ReportNode is FAILED_PRECONDITION).
  std::string locality_record;
  // A node that reported and then not for this long is removed; zero:
  // never. Default 30 s (--node_dead_after_s).
  absl::Duration node_dead_after = absl::Seconds(30);
  // How often silent nodes are looked for. Default 1 s.
  absl::Duration node_check_interval = absl::Seconds(1);
};

class PackerServer final : public Daemon {
 public:
  explicit PackerServer(PackerServerOptions options);
  ~PackerServer() override;

  // Loading the index cannot be interrupted; RunDaemon bounds a stop then.
  absl::Status Start(const StopSignal& stop) override;
  // Stops accepting calls, finishes in-flight ones, stops the planners.
  void Shutdown() override;
  // "tutti-packerd listening on HOST:PORT (metrics HOST:PORT)"
  std::string Banner() const override;

  int port() const { return host_ ? host_->grpc_port() : 0; }
  const Job& job() const { return *job_; }

 private:
  // Reads --cost_fit_record into the schedule the planner reads (when the
  // fit is on or the record holds fits).
  absl::Status LoadCostFits();
  // Reads --locality_record into the schedule the planner reads and starts
  // the monitor of the stagers' node reports (with locality and a record).
  absl::Status LoadLocality();

  const PackerServerOptions options_;
  std::unique_ptr<DaemonHost> host_;
  std::unique_ptr<PackerMetrics> metrics_;
  std::shared_ptr<const Job> job_;
  std::unique_ptr<CostFitRecord> cost_record_;
  std::unique_ptr<CostSchedule> costs_;  // null without a record and a fit
  std::unique_ptr<LocalityRecord> locality_record_;
  std::unique_ptr<LocalitySchedule> locality_;  // null without locality and a record
  std::unique_ptr<LocalityMonitor> monitor_;
  std::unique_ptr<PlanWindow> window_;
  std::unique_ptr<Packer> packer_;
  std::unique_ptr<RpcGate> gate_;
  std::unique_ptr<RankIdentities> ranks_;
  std::unique_ptr<PackerService> service_;
  bool shut_down_ = false;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_PACKER_SERVER_H_
