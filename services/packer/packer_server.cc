#include "services/packer/packer_server.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/status.h"
#include "services/packer/load_job.h"

namespace tutti::packer {
namespace {

const Logger kLog("packer");

constexpr char kIndex[] = "index";
constexpr char kPlans[] = "plans";
// Steps the cost fit and locality records reserve for planning at a time.
constexpr uint64_t kCostReserveChunk = 256;

}  // namespace

PackerServer::PackerServer(PackerServerOptions options) : options_(std::move(options)) {}

PackerServer::~PackerServer() { Shutdown(); }

absl::Status PackerServer::Start(const StopSignal& stop) {
  ASSIGN_OR_RETURN(host_,
                   DaemonHost::Start({"tutti-packerd", options_.metrics, options_.port_file}));
  Readiness& ready = host_->readiness();
  ready.Require(kIndex, "loading the job config and the index");
  ready.Require(kPlans, "the first plan is not computed yet");
  LoadJobStats loaded;
  ASSIGN_OR_RETURN(
      job_, LoadJob(options_.config_path, options_.index_path, options_.job, nullptr, &loaded));
  ready.Set(kIndex, absl::OkStatus());
  if (stop.requested()) return absl::CancelledError("stopped while starting");
  metrics_ = std::make_unique<PackerMetrics>(*host_->registry());
  metrics_->index_samples.Set(job_->index().num_samples());
  metrics_->SetMemory(loaded.samples, loaded.index_mapped_bytes, loaded.index_heap_bytes,
                      loaded.job_heap_bytes);
  const double n = static_cast<double>(std::max<uint64_t>(loaded.samples, 1));
  kLog.Info("index loaded",
            {{"path", job_->index().origin()},
             {"samples", loaded.samples},
             {"seconds", absl::StrFormat("%.3f", loaded.index_seconds)},
             {"mapped_bytes", loaded.index_mapped_bytes},
             {"heap_bytes", loaded.index_heap_bytes},
             {"mapped_bytes_per_sample", absl::StrFormat("%.2f", loaded.index_mapped_bytes / n)},
             {"heap_bytes_per_sample", absl::StrFormat("%.4f", loaded.index_heap_bytes / n)}});
  kLog.Info("job built over the index",
            {{"seconds", absl::StrFormat("%.3f", loaded.job_seconds)},
             {"heap_bytes", loaded.job_heap_bytes},
             {"heap_bytes_per_sample", absl::StrFormat("%.2f", loaded.job_heap_bytes / n)}});
  metrics_->SetUnplanned(job_->unservable());
  std::vector<std::string> sources;
  for (uint32_t i = 0; i < job_->num_sources(); ++i) sources.push_back(job_->source_name(i));
  metrics_->SetSources(sources);
  RETURN_IF_ERROR(LoadCostFits());
  RETURN_IF_ERROR(LoadLocality());
  PlanWindowOptions wo;
  wo.window = job_->config().plan_window();
  wo.threads = options_.plan_threads;
  window_ = std::make_unique<PlanWindow>(
      std::make_shared<Planner>(job_, locality_.get(), costs_.get()), wo, metrics_.get());
  packer_ =
      std::make_unique<Packer>(job_, window_.get(), metrics_.get(), options_.served, costs_.get());
  gate_ = std::make_unique<RpcGate>(options_.rpc, "tutti.v1.Packer", host_->registry().get());
  ranks_ = std::make_unique<RankIdentities>(gate_->authenticator().requires_token());
  ranks_->SetJob(job_->config().job_id());
  service_ = std::make_unique<PackerService>(packer_.get(), gate_.get(), ranks_.get(),
                                             options_.max_streams_per_client, monitor_.get());
  GrpcServerOptions grpc_options;
  RETURN_IF_ERROR(ApplyRpcGateOptions(
      gate_.get(), options_.listen, [](const std::string& w) { kLog.Warning(w); }, &grpc_options));
  RETURN_IF_ERROR(
      host_->ServeGrpc(options_.listen, {service_.get()}, "tutti.v1.Packer", grpc_options));
  // Ready once the window has planned its first step (or says why it cannot).
  window_->Get(0, [&ready](absl::StatusOr<PlanPtr> plan) {
    ready.Set(kPlans, plan.ok() ? absl::OkStatus()
                                : absl::Status(plan.status().code(),
                                               absl::StrCat("step 0 cannot be planned: ",
                                                            plan.status().message())));
  });
  return host_->Serving();
}

absl::Status PackerServer::LoadCostFits() {
  const bool fit = OnlineFitOptionsFrom(job_->config()).enabled;
  if (options_.cost_fit_record.empty()) {
    if (!fit) return absl::OkStatus();
    return absl::InvalidArgumentError(
        "the job's cost.online_fit is enabled, which needs --cost_fit_record: a file where "
        "tutti-packerd records each fit it announces, so that a restarted packer plans every "
        "step as before (give a path on persistent storage, one per job)");
  }
  ASSIGN_OR_RETURN(CostFitRecordData data,
                   ReadCostFitRecord(options_.cost_fit_record, job_->fingerprint()));
  if (!fit && data.fits.empty()) {
    kLog.Info(absl::StrCat("--cost_fit_record ", options_.cost_fit_record,
                           " is not used: the job's cost.online_fit is off"));
    return absl::OkStatus();
  }
  kLog.Info(absl::StrCat("cost fit record ", options_.cost_fit_record, ": ", data.fits.size(),
                         " fits, steps below ", data.planned_through,
                         " may have been planned before; a new fit lands after them"));
  costs_ = std::make_unique<CostSchedule>(data.fits, data.planned_through);
  if (fit) {
    cost_record_ = std::make_unique<CostFitRecord>(options_.cost_fit_record, std::move(data));
    cost_record_->Attach(costs_.get(), kCostReserveChunk);
  }
  return absl::OkStatus();
}

absl::Status PackerServer::LoadLocality() {
  if (job_->homes() == nullptr) {
    if (!options_.locality_record.empty()) {
      kLog.Info(absl::StrCat("--locality_record ", options_.locality_record,
                             " is not used: the job has no locality"));
    }
    return absl::OkStatus();
  }
  if (options_.locality_record.empty()) {
    kLog.Warning(
        "the job has locality but no --locality_record: the stagers' node reports are not acted "
        "on (a dead node is not re-homed, a full cache not re-homed within its capacity); give "
        "a record file on persistent storage to turn that on");
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(LocalityReplay replay,
                   LoadLocalityReplay(job_, options_.job.node_removals, options_.locality_record));
  LocalityRecordData& data = replay.data;
  kLog.Info(absl::StrCat("locality record ", options_.locality_record, ": ", data.changes.size(),
                         " node changes, steps below ", data.planned_through,
                         " may have been planned before; a new change lands after them"));
  locality_ = std::move(replay.schedule);
  locality_record_ = std::make_unique<LocalityRecord>(options_.locality_record, std::move(data));
  locality_record_->Attach(locality_.get(), kCostReserveChunk);
  LocalityMonitorOptions mo;
  mo.liveness.dead_after = options_.node_dead_after;
  mo.tick = options_.node_check_interval;
  for (const NodeRemoval& r : options_.job.node_removals) mo.operator_removed.push_back(r.node);
  monitor_ = std::make_unique<LocalityMonitor>(job_, locality_.get(), metrics_.get(), mo);
  monitor_->Start();
  return absl::OkStatus();
}

void PackerServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // Calls still running after a second are cancelled (plans take
  // milliseconds; an idle client connection would otherwise hold the
  // shutdown until the deadline).
  if (host_) host_->StopGrpc(absl::Seconds(1));
  if (monitor_) monitor_->Stop();
  if (window_) window_->Stop();
  if (host_) host_->Stop();
}

std::string PackerServer::Banner() const {
  return absl::StrCat("tutti-packerd listening on ", host_->grpc_address(), " (metrics ",
                      WithPort(options_.metrics, host_->metrics_port()), ")");
}

}  // namespace tutti::packer
