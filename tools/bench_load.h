// The load driver of `tutti bench load`: many concurrent gRPC clients of one
// tutti-packerd, each on its own connection, alternating a bounded
// StreamPlans (reading every plan of a short range) and a GetPlan, with the
// latency of every plan received recorded. Plans are received whole and
// left encoded (an empty one is a failure). Everything is asynchronous
// (gRPC's callback API): one process holds thousands of clients with a few
// threads. Bounded in calls per client and in time.
//
// Thread-safety: RunRound from one thread at a time; callbacks run on gRPC's
// threads.
#ifndef TUTTI_TOOLS_BENCH_LOAD_H_
#define TUTTI_TOOLS_BENCH_LOAD_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tutti::tools {

struct LoadOptions {
  std::string target;          // the packer, "host:port"
  uint32_t clients = 2560;     // concurrent clients, each on its own connection
  uint32_t world_size = 2560;  // ranks of the job; client i asks as rank i % world_size
  uint64_t first_step = 0;     // clients ask only for steps [first_step, last_step]
  uint64_t last_step = 7;      // (the precomputed ones)
  uint32_t calls = 6;          // calls per client per round, streams and GetPlans alternating
  uint32_t stream_plans = 4;   // plans per StreamPlans call
  // Open loop: client i starts its calls at i * interval / clients + k *
  // interval into the round (a step's cadence), and a call's latency counts
  // from when it was due. Zero: closed loop, each call as soon as the
  // previous one ends (the packer's throughput under a burst).
  absl::Duration interval = absl::Seconds(1);
  absl::Duration call_timeout = absl::Seconds(60);    // deadline of one call
  absl::Duration round_timeout = absl::Seconds(300);  // a round ends here, calls cancelled
};

struct LoadRound {
  uint32_t clients = 0;
  uint64_t unary_calls = 0;  // GetPlan calls completed OK
  uint64_t streams = 0;      // StreamPlans calls completed OK
  uint64_t plans = 0;        // plans received (both kinds)
  uint64_t errors = 0;       // calls that failed or were cancelled
  std::string first_error;   // the first failure, for the report
  double seconds = 0;        // wall time of the round
  // Latency of each plan: a GetPlan from when the call was due to the
  // answer; a streamed plan from when the call was due (first plan) or from
  // the previous plan to its arrival. Milliseconds.
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
  double unary_p50_ms = 0, unary_p99_ms = 0;
  double stream_p50_ms = 0, stream_p99_ms = 0;
  // How late calls were started against when they were due: the driver's
  // (and the machine's) share of the latency, not the packer's. Calls are
  // due at fixed times; one whose client's previous call answered after
  // that time starts late too.
  double late_p99_ms = 0;
};

class LoadDriver {
 public:
  // Opens options.clients channels (separate connections) and waits up to
  // `connect` for each to be ready.
  static absl::StatusOr<std::unique_ptr<LoadDriver>> Connect(const LoadOptions& options,
                                                             absl::Duration connect);

  // One round: every client makes options.calls calls; returns when all are
  // done or round_timeout passed (then the rest are cancelled and counted as
  // errors).
  LoadRound RunRound(uint32_t round);

 private:
  explicit LoadDriver(LoadOptions options) : options_(std::move(options)) {}
  LoadOptions options_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
};

// The p-th quantile (0..1) of `v` (sorted in place); 0 when empty.
double Quantile(std::vector<double>* v, double p);

}  // namespace tutti::tools

#endif  // TUTTI_TOOLS_BENCH_LOAD_H_
