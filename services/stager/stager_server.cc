#include "services/stager/stager_server.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "services/stager/peer_fetcher.h"

namespace tutti::stager {
namespace {

const Logger kLog("stager.server");

constexpr char kPacker[] = "packer";
constexpr char kCache[] = "cache";
constexpr char kSource[] = "source";

}  // namespace

StagerServer::StagerServer(StagerServerOptions options) : opts_(std::move(options)) {}

StagerServer::~StagerServer() { Shutdown(); }

absl::Status StagerServer::Start(const StopSignal& stop) {
  absl::Status s = StartServing(stop);
  if (!s.ok() && stop.requested()) return absl::CancelledError("stopped while starting");
  return s;
}

absl::Status StagerServer::StartServing(const StopSignal& stop) {
  ASSIGN_OR_RETURN(host_, DaemonHost::Start({"tutti-stagerd", opts_.metrics, opts_.port_file}));
  Readiness& ready = host_->readiness();
  ready.Require(kPacker, absl::StrCat("waiting for the packer at ", opts_.packer));
  ready.Require(kCache, "the cache is not open yet");
  ready.Require(kSource, absl::StrCat("--source ", opts_.core.staging.source_dir,
                                      " not checked yet"));
  metrics_ = std::make_shared<StagerMetrics>(host_->registry());
  // Bind the gRPC port before talking to the packer, so a port in use fails at once.
  core_ = std::make_unique<StagerCore>(opts_.core, metrics_);
  if (!opts_.peers.empty()) {
    core_->SetPeers(std::make_unique<PeerFetcher>(opts_.peers, opts_.rpc.security, metrics_.get()));
  }
  gate_ = std::make_unique<RpcGate>(opts_.rpc, "tutti.v1.Stager", host_->registry().get());
  ranks_ = std::make_unique<RankIdentities>(gate_->authenticator().requires_token());
  service_ = std::make_unique<StagerService>(core_.get(), gate_.get(), ranks_.get(), metrics_);
  GrpcServerOptions grpc_options;
  grpc_options.socket_gid = opts_.core.share_gid;
  RETURN_IF_ERROR(ApplyRpcGateOptions(gate_.get(), opts_.listen,
                                      [](const std::string& w) { kLog.Warning(w); },
                                      &grpc_options));
  RETURN_IF_ERROR(
      host_->ServeGrpc(opts_.listen, {service_.get()}, "tutti.v1.Stager", grpc_options));
  if (!opts_.peer_listen.empty()) {
    peer_service_ = std::make_unique<PeerStagerService>(service_.get(), gate_.get());
    GrpcServerOptions peer_options;
    RETURN_IF_ERROR(ApplyRpcGateOptions(
        gate_.get(), opts_.peer_listen, [](const std::string& w) { kLog.Warning(w); },
        &peer_options));
    ASSIGN_OR_RETURN(peer_port_, host_->ServeMoreGrpc("peer_grpc", opts_.peer_listen,
                                                      {peer_service_.get()}, peer_options));
  }
  plans_ = std::make_unique<PlanClient>(opts_.packer, metrics_.get(), opts_.rpc.security);
  probe_io_ = std::make_unique<IoService>(MakePreadBackend(1));
  prober_ = std::thread([this] { Probe(); });
  ASSIGN_OR_RETURN(v1::JobInfo job, plans_->FetchJob(absl::Now() + opts_.packer_wait, &stop));
  ready.Set(kPacker, absl::OkStatus());
  ranks_->SetJob(job.config().job_id());
  if (stop.requested()) return absl::CancelledError("stopped while starting");
  RETURN_IF_ERROR(core_->Start(job));
  // The cache directory as the core opened (and locked) it: the prober
  // checks that it is still there.
  ASSIGN_OR_RETURN(cache_id_, StatDir("cache", opts_.core.cache_dir));
  const RootDir& source = core_->staging()->source_root();
  source_id_ = DirId{major(source.dev()), minor(source.dev()), static_cast<uint64_t>(source.ino())};
  core_started_ = true;
  ready.Set(kCache, absl::OkStatus());
  host_->SetLiveness([core = core_.get()] { return core->Live(); });
  plans_->Start(core_.get());
  return host_->Serving();
}

absl::StatusOr<StagerServer::DirId> StagerServer::StatDir(const std::string& flag,
                                                          const std::string& dir) {
  auto stx = std::make_shared<struct statx>();
  IoOp op;
  op.kind = IoOp::Kind::kStat;
  op.path = dir.c_str();
  op.stx = stx.get();
  const int64_t r = probe_io_->Run(op, absl::Now() + opts_.probe_interval, stx);
  if (r == -ETIMEDOUT) {
    return absl::UnavailableError(absl::StrCat("--", flag, " ", dir, " does not answer within ",
                                               absl::FormatDuration(opts_.probe_interval),
                                               " (the file system stalls)"));
  }
  if (r < 0) {
    return absl::UnavailableError(absl::StrCat("--", flag, " ", dir, " is not reachable: ",
                                               std::strerror(static_cast<int>(-r))));
  }
  if (!S_ISDIR(stx->stx_mode)) {
    return absl::UnavailableError(absl::StrCat("--", flag, " ", dir, " is not a directory"));
  }
  return DirId{stx->stx_dev_major, stx->stx_dev_minor, stx->stx_ino};
}

absl::Status StagerServer::CheckSource() {
  ASSIGN_OR_RETURN(const DirId now, StatDir("source", opts_.core.staging.source_dir));
  if (core_started_ && !(now == source_id_)) {
    return absl::UnavailableError(absl::StrCat(
        "--source ", opts_.core.staging.source_dir,
        " is another directory than the one this daemon opened (remounted or replaced); shard "
        "files are opened beneath the one it opened: restart the daemon to use it"));
  }
  return absl::OkStatus();
}

absl::Status StagerServer::CheckCache() {
  ASSIGN_OR_RETURN(const DirId now, StatDir("cache", opts_.core.cache_dir));
  if (!(now == cache_id_)) {
    return absl::UnavailableError(absl::StrCat(
        "--cache ", opts_.core.cache_dir,
        " is another directory than the one this daemon opened (removed or replaced); restart "
        "the daemon to use it"));
  }
  return absl::OkStatus();
}

void StagerServer::Probe() {
  Readiness& ready = host_->readiness();
  do {
    ready.Set(kSource, CheckSource());
    if (core_started_) {
      ready.Set(kCache, CheckCache());
      ready.Set(kPacker, plans_->CheckPacker(opts_.probe_interval));
    }
  } while (!stop_probe_.WaitForNotificationWithTimeout(opts_.probe_interval));
}

std::string StagerServer::Banner() const {
  const std::string node =
      opts_.core.node_auto ? std::string("auto") : absl::StrCat(opts_.core.node);
  const std::string peers =
      opts_.peer_listen.empty()
          ? std::string()
          : absl::StrCat(", peers on ", WithPort(opts_.peer_listen, peer_port_));
  return absl::StrCat("tutti-stagerd node ", node, " listening on ", grpc_address(), peers,
                      " (metrics ", WithPort(opts_.metrics, metrics_port()), ")");
}

void StagerServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (host_) host_->readiness().ShuttingDown();
  if (prober_.joinable()) {
    stop_probe_.Notify();
    prober_.join();
  }
  if (core_) core_->Stop();  // answers waiting clients with UNAVAILABLE, wakes the plan stream
  if (plans_) plans_->Stop();
  // Every call waiting in the core has been answered by now, and the others
  // (ReleaseBatch, GetStageStatus) take microseconds: what is still open
  // after a moment is a connected client's idle channel, which gRPC would
  // otherwise wait on for the whole grace.
  if (host_) host_->StopGrpc(absl::Milliseconds(300));
  plans_.reset();
  probe_io_.reset();
  if (host_) host_->Stop();
}

}  // namespace tutti::stager
