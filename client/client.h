// libtutti: what every training rank links. A Client pulls the rank's batch
// for each step from its node's tutti-stagerd (shared memory, zero copy),
// runs the plan's all-to-all through a Transport, and reports step timings
// to tutti-packerd.
//
//   auto client = tutti::Client::Connect({.stager_address = "127.0.0.1:7071", ...});
//   client->SetTransport(*tutti::MpiTransport::CreateWorld());
//   for (;;) {
//     auto batch = client->Next();            // waits for step s
//     ... encoder forward on batch->pixel_values() ...
//     client->Exchange(*batch, send, n, recv, m);
//     ... LLM forward/backward ...
//     client->ReportTiming(batch->step(), {{"vit", 0.4}, {"llm", 1.2}});
//   }                                          // the batch is released here
//
// Thread-safety: Next(), Exchange() and ExchangeBackward() from one thread;
// ReportTiming() from any thread.
#ifndef TUTTI_CLIENT_CLIENT_H_
#define TUTTI_CLIENT_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/batch.h"
#include "client/proto_fwd.h"
#include "client/retry.h"
#include "client/transport.h"
#include "common/security_options.h"

namespace tutti {

// What a waiting Connect() or Next() reports (ClientOptions.progress).
struct WaitProgress {
  int64_t step = -1;          // the step Next() waits for; -1 in Connect()
  double waited_seconds = 0;  // since the call began
  // What it still waits for: the stager's own account of the batch (no plan
  // from the packer yet, shards being staged, the window, decoding), or which
  // daemon is not available yet and why.
  std::string waiting_for;
};

struct ClientOptions {
  // This node's tutti-stagerd, "host:port" or "unix:///path". Empty:
  // $TUTTI_STAGER, else kDefaultStagerSocket when that socket exists.
  std::string stager_address;
  // The job's tutti-packerd, "host:port". Empty: $TUTTI_PACKER (required).
  std::string packer_address;
  // This process's rank. -1: $TUTTI_RANK, else $RANK (torchrun),
  // $OMPI_COMM_WORLD_RANK, $PMI_RANK, $SLURM_PROCID (required one way or the other).
  int rank = -1;
  // Ranks in the job. -1: $TUTTI_WORLD_SIZE, else $WORLD_SIZE (torchrun),
  // $OMPI_COMM_WORLD_SIZE, $PMI_SIZE, $SLURM_NTASKS; when none is set, the job's world size is taken
  // as is. When known, Connect checks it against the job's.
  int world_size = -1;
  // The first step Next() returns (resuming a run). -1: $TUTTI_START_STEP, else 0.
  int64_t start_step = -1;
  // How long Connect keeps trying to reach the packer and the stager. Default 60 s.
  absl::Duration connect_timeout = absl::Seconds(60);
  // How long Next() waits for one batch, retries while a stager restarts
  // included. Default 600 s.
  absl::Duration batch_timeout = absl::Seconds(600);
  // Deadline of one small RPC attempt (GetJob, ReleaseBatch). Default 30 s.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // How long small RPCs retry UNAVAILABLE (a restarting daemon). Default 120 s.
  absl::Duration retry_budget = absl::Seconds(120);
  // ReportTiming's total time, retries included: timings are advisory and
  // must not stall training. Default 2 s.
  absl::Duration report_timeout = absl::Seconds(2);
  // Backoff between retries: doubles from initial to max. Defaults 100 ms, 5 s.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // Map batches copy-on-write (Batch::Map): views may be written, the writes
  // staying in this process. Default false: read-only.
  bool copy_on_write = false;
  // While Connect() or Next() waits: `progress` is called on the waiting
  // thread every progress_interval, the first time one interval after the
  // call began (a quick call reports nothing). Next() then asks the stager
  // for the batch one interval at a time, so that it hears what the batch
  // still waits for. Default: zero interval, no reports.
  absl::Duration progress_interval = absl::ZeroDuration();
  std::function<void(const WaitProgress&)> progress;
  // TLS (a CA to verify the daemons, a certificate for mutual TLS) and the
  // job's token. Unset fields come from TUTTI_TLS_CA, TUTTI_TLS_CERT,
  // TUTTI_TLS_KEY, TUTTI_TLS_SERVER_NAME, TUTTI_TOKEN_FILE / TUTTI_TOKEN
  // (common/security_options.h). Default: none (loopback daemons).
  SecurityOptions security;
};

// The stager address used when neither ClientOptions.stager_address nor
// $TUTTI_STAGER is set, if that socket exists (the deploy files' default).
inline constexpr const char* kDefaultStagerSocket = "/var/run/tutti/stager.sock";

// Fills unset fields of `opts` from the environment (see ClientOptions) and
// checks them; INVALID_ARGUMENT names the missing or bad setting and how to
// set it. `getenv` is injectable for tests.
absl::StatusOr<ClientOptions> ResolveClientOptions(
    ClientOptions opts, const std::function<const char*(const char*)>& getenv = nullptr,
    const std::function<bool(const char*)>& socket_exists = nullptr);

// Checks a client of `rank` in `world_size` ranks (-1: unknown) against the
// job; returns the job's world size. FAILED_PRECONDITION naming both sizes
// and the fix on a mismatch.
absl::StatusOr<uint32_t> CheckJobWorldSize(const v1::JobInfo& job, int rank, int world_size);

// A phase's duration for ReportTiming ("data_wait", "vit", "llm", "exchange", "step").
using PhaseTime = std::pair<std::string, double>;

class Client {
 public:
  // Resolves options, fetches the job from the packer (GetJob) and checks the
  // world size and rank against it, and checks that the stager answers.
  // UNAVAILABLE is retried for options.connect_timeout.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  ~Client();

  // The rank's batch for the next step (start_step, then one more per
  // successful call): AcquireBatch from the stager, then the segment mapped
  // read-only. UNAVAILABLE is retried with backoff until batch_timeout (a
  // restarting stager does not end the run). OUT_OF_RANGE past the dataset's
  // end. Other errors name the step and rank; the step is not advanced, so
  // calling again retries it.
  absl::StatusOr<Batch> Next();

  // Sends this rank's phase timings for `step` to the packer (counted and
  // exposed as metrics). Gives up after options.report_timeout.
  absl::Status ReportTiming(uint64_t step, const std::vector<PhaseTime>& phases);

  // The transport Exchange() uses (e.g. MpiTransport::CreateWorld()).
  void SetTransport(std::unique_ptr<Transport> transport) { transport_ = std::move(transport); }
  Transport* transport() const { return transport_.get(); }

  // The plan's forward / backward exchange of a batch through the transport
  // (see Transport::Exchange). FAILED_PRECONDITION when no transport is set.
  absl::Status Exchange(const Batch& batch, const void* send, size_t send_bytes, void* recv,
                        size_t recv_bytes);
  absl::Status ExchangeBackward(const Batch& batch, const void* send, size_t send_bytes, void* recv,
                                size_t recv_bytes);
  // The same for a plan held apart from its batch.
  absl::Status Exchange(const v1::RankPlan& plan, uint64_t step, const void* send,
                        size_t send_bytes, void* recv, size_t recv_bytes);
  absl::Status ExchangeBackward(const v1::RankPlan& plan, uint64_t step, const void* send,
                                size_t send_bytes, void* recv, size_t recv_bytes);
  // The plan's load exchange (post-balancing: inputs whose shard this node
  // does not stage), before the encoders run; see Transport::ExchangeLoad.
  absl::Status ExchangeLoad(const v1::RankPlan& plan, uint64_t step, const void* send,
                            size_t send_bytes, void* recv, size_t recv_bytes);

  // The job as the packer described it (include "tutti/v1/packer.pb.h" to
  // read its fields).
  const v1::JobInfo& job() const;
  const ClientOptions& options() const { return options_; }
  uint32_t rank() const { return rank_; }
  uint32_t world_size() const { return world_size_; }
  uint64_t next_step() const { return next_step_; }
  // Seconds spent in Next() so far.
  double total_wait_seconds() const { return total_wait_seconds_; }

 private:
  // The connections and the job: gRPC and protobuf types, kept out of this
  // header (client.cc).
  struct Impl;

  Client();
  RetryPolicy Policy(absl::Duration budget) const;

  ClientOptions options_;
  uint32_t rank_ = 0;
  uint32_t world_size_ = 0;
  uint64_t next_step_ = 0;
  double total_wait_seconds_ = 0;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<Transport> transport_;
};

}  // namespace tutti

#endif  // TUTTI_CLIENT_CLIENT_H_
