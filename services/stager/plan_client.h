// Pulls the job and this node's step plans from tutti-packerd: GetJob with
// retry and backoff while the packer is unavailable, then StreamPlans for
// the local ranks, feeding StagerCore. Each stream asks for a bounded range
// (StreamPlansRequest.end_step): the steps the core has room for, so the
// packer plans no further ahead than this node's window needs; the next
// range is asked for as clients release batches. A broken stream (packer
// restart) is re-opened at the next step the core needs; plans are
// deterministic, so the resumed stream is exact. Errors the packer means (a step it cannot serve,
// a config mismatch) are handed to the core for the clients that ask.
//
// Threads: Run() owns one thread; Stop() and CheckPacker() may be called
// from any thread.
#ifndef TUTTI_SERVICES_STAGER_PLAN_CLIENT_H_
#define TUTTI_SERVICES_STAGER_PLAN_CLIENT_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/security_options.h"
#include "common/stop_signal.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "services/stager/metrics.h"
#include "services/stager/stager_core.h"
#include "tutti/v1/packer.grpc.pb.h"

namespace tutti::stager {

class PlanClient {
 public:
  // `security`: the TLS settings and token to reach the packer with.
  PlanClient(std::string packer_address, StagerMetrics* metrics,
             const SecurityOptions& security = {});
  ~PlanClient();

  // Calls GetJob until it answers, retrying UNAVAILABLE with backoff (and a
  // log line) until `give_up`, or CANCELLED soon after `stop` (if set) is
  // requested. Other errors are returned with context.
  absl::StatusOr<v1::JobInfo> FetchJob(absl::Time give_up, const StopSignal* stop = nullptr);
  // Whether the packer answers: its health service says SERVING for
  // tutti.v1.Packer (a packer without one answering at all counts too).
  // UNAVAILABLE with the reason otherwise.
  absl::Status CheckPacker(absl::Duration timeout);
  // Streams plans into `core` on a thread until Stop().
  void Start(StagerCore* core);
  void Stop();
  // The channel to the packer (its TLS and token), for the node reporter.
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  void Run();

  const std::string address_;
  StagerMetrics* metrics_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Packer::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  StagerCore* core_ = nullptr;
  std::atomic<bool> stop_{false};
  absl::Notification stopped_;  // wakes the stream's reconnect backoff
  absl::Mutex mu_;
  grpc::ClientContext* stream_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;  // the open stream, for Stop
  std::thread thread_;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_PLAN_CLIENT_H_
