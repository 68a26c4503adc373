// tutti-stagerd's lifecycle: serves the operational endpoints (daemon_host.h),
// binds the gRPC service, fetches the job from the packer, starts the core
// and the plan stream, keeps readiness current (every probe interval: the
// cache directory still the one it opened, the source answering a stat,
// the packer answering its health check), and shuts them down in order.
#ifndef TUTTI_SERVICES_STAGER_STAGER_SERVER_H_
#define TUTTI_SERVICES_STAGER_STAGER_SERVER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/daemon.h"
#include "common/daemon_host.h"
#include "common/rank_identity.h"
#include "common/rpc_gate.h"
#include "common/uring_file.h"
#include "services/stager/peer_service.h"
#include "services/stager/plan_client.h"
#include "services/stager/stager_core.h"
#include "services/stager/stager_service.h"

namespace tutti::stager {

struct StagerServerOptions {
  std::string packer = "127.0.0.1:7070";   // tutti-packerd address
  std::string listen = "127.0.0.1:7071";   // gRPC address: HOST:PORT (port 0 = any free port)
                                           // or unix:///PATH (a Unix-domain socket)
  // A second gRPC address, HOST:PORT (port 0 = any free port), serving
  // only other nodes' stagers (FetchMembers) and health, with the same
  // token and TLS (peer_service.h): how a stager whose --listen is a Unix
  // socket for its ranks is reached by the others' --peers. Empty: none
  // (the others ask --listen).
  std::string peer_listen;
  std::string metrics = "127.0.0.1:9471";  // /metrics, /healthz, /readyz (port 0 = any free port)
  std::string port_file;                   // if set: "grpc=PORT\nmetrics=PORT\ngrpc_address=A\n"
                                           // written there (PORT 0 for a Unix socket), and
                                           // "peer_grpc=PORT\npeer_grpc_address=A\n" with
                                           // peer_listen
  absl::Duration packer_wait = absl::Minutes(10);  // how long to retry GetJob
  absl::Duration probe_interval = absl::Seconds(2);  // how often readiness checks the
                                                     // source and the packer
  StagerOptions core;
  // The other nodes' stagers (--peers): node -> gRPC address, asked first for
  // remote_load members whose plan names their node (peer_fetcher.h), with
  // `rpc`'s TLS and token. Empty: remote_load members come from the source.
  std::map<uint32_t, std::string> peers;
  RpcGateOptions rpc;  // TLS, token, request bounds (rpc_gate.h); its TLS and
                       // token also reach the packer
};

class StagerServer final : public Daemon {
 public:
  explicit StagerServer(StagerServerOptions options);
  ~StagerServer() override;

  // Returns CANCELLED soon after `stop` is requested (while waiting for the packer too).
  absl::Status Start(const StopSignal& stop) override;
  absl::Status Start() { return Start(never_); }
  void Shutdown() override;  // idempotent
  // "tutti-stagerd node N listening on ADDRESS (metrics HOST:PORT)"
  std::string Banner() const override;

  int grpc_port() const { return host_ ? host_->grpc_port() : 0; }  // 0 for a Unix socket
  // Where clients connect: HOST:PORT with the bound port, or the unix: address.
  std::string grpc_address() const { return host_ ? host_->grpc_address() : ""; }
  int metrics_port() const { return host_ ? host_->metrics_port() : 0; }
  int peer_port() const { return peer_port_; }  // --peer_listen's bound port (0: none)
  StagerCore* core() { return core_.get(); }
  Readiness* readiness() { return host_ ? &host_->readiness() : nullptr; }

 private:
  absl::Status StartServing(const StopSignal& stop);
  // A directory's identity, to tell it from another one put in its place.
  struct DirId {
    uint32_t dev_major = 0, dev_minor = 0;
    uint64_t ino = 0;
    bool operator==(const DirId&) const = default;
  };
  void Probe();  // the readiness prober's loop
  // Stats `dir` (given with --`flag`) within the probe interval: UNAVAILABLE
  // saying why when it does not answer, is gone or is not a directory.
  absl::StatusOr<DirId> StatDir(const std::string& flag, const std::string& dir);
  absl::Status CheckSource();
  absl::Status CheckCache();  // still the directory the core opened

  const StagerServerOptions opts_;
  StopSignal never_;  // for Start() without a signal
  std::unique_ptr<DaemonHost> host_;
  std::shared_ptr<StagerMetrics> metrics_;
  std::unique_ptr<StagerCore> core_;
  std::unique_ptr<RpcGate> gate_;
  std::unique_ptr<RankIdentities> ranks_;
  std::unique_ptr<StagerService> service_;
  std::unique_ptr<PeerStagerService> peer_service_;  // with peer_listen
  int peer_port_ = 0;
  std::unique_ptr<PlanClient> plans_;
  std::unique_ptr<IoService> probe_io_;  // stats the source with a deadline (it may hang)
  absl::Notification stop_probe_;
  std::thread prober_;
  std::atomic<bool> core_started_{false};  // read by the prober
  DirId cache_id_;                         // set before core_started_
  DirId source_id_;                        // the --source staging opened; set before core_started_
  bool shut_down_ = false;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_STAGER_SERVER_H_
