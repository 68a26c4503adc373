// The packer's side of node faults with locality: takes the stagers'
// node reports (Packer.ReportNode), checks them against the job, and
// announces on the locality schedule what the reports call for
// (node_liveness.h): a dead node removed, a returning one added back, a
// full cache re-homed within its capacity, each from the first step not
// yet planned (locality_schedule.h). A change that cannot be taken (the
// homes would not fit the capacities) is logged as an error and counted,
// never stops the job: plans go on with the homes in force, and what a
// full stager cannot stage it reads from the source.
//
// Threads: Report() from gRPC threads; a thread of its own checks for
// silent nodes every `tick` between Start() and Stop().
#ifndef TUTTI_SERVICES_PACKER_LOCALITY_MONITOR_H_
#define TUTTI_SERVICES_PACKER_LOCALITY_MONITOR_H_

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "services/packer/core/job.h"
#include "services/packer/core/locality_schedule.h"
#include "services/packer/core/node_liveness.h"
#include "services/packer/metrics.h"
#include "tutti/v1/packer.pb.h"

namespace tutti::packer {

inline constexpr int kMaxReportedShardNames = 16;
inline constexpr size_t kMaxReportedShardName = 1024;

struct LocalityMonitorOptions {
  // tutti-packerd --node_dead_after_s (zero: a node is never counted dead).
  NodeLivenessOptions liveness;
  // How often silent nodes are looked for. Default 1 s.
  absl::Duration tick = absl::Seconds(1);
  // Nodes the operator removed (--node_removals): not added back.
  std::vector<uint32_t> operator_removed;
  // The clock (tests pass a fake one). Default absl::Now.
  std::function<absl::Time()> clock = [] { return absl::Now(); };
};

class LocalityMonitor {
 public:
  // `schedule` (the planner's) and `metrics` (may be null) must outlive the
  // monitor.
  LocalityMonitor(std::shared_ptr<const Job> job, LocalitySchedule* schedule,
                  PackerMetrics* metrics, LocalityMonitorOptions options);
  ~LocalityMonitor();

  // Checks a report (node within the job, the job's fingerprint, bounded
  // names): INVALID_ARGUMENT / FAILED_PRECONDITION naming what was wrong.
  // Then notes it and announces what it calls for.
  absl::Status Report(const v1::NodeReport& report);
  // Announces what is due now (silent nodes); the thread calls it.
  void Tick();

  void Start();
  void Stop();

 private:
  void Act(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetMetrics(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<const Job> job_;
  LocalitySchedule* const schedule_;
  PackerMetrics* const metrics_;
  const LocalityMonitorOptions options_;
  absl::Mutex mu_;
  NodeLiveness liveness_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_LOCALITY_MONITOR_H_
