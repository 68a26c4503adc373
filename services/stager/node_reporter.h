// Reports this node to the packer with locality (Packer.ReportNode), every
// `interval` on a thread of its own, over the plan client's channel (its
// TLS and token): the node, the job's config fingerprint, the cache's
// capacity and bytes held, and the shards it could not stage for want of
// space. The packer counts a node that stops reporting dead and re-homes
// its shards, and re-homes within a capacity smaller than the homes
// (services/packer/README.md). Nothing is sent while the node is not known
// yet (--node auto before a rank arrives). A failed report is counted and
// logged (rate-limited) and the next one is sent on time; a packer that
// does not act on reports (FAILED_PRECONDITION: no --locality_record) is
// logged once, with what it costs and the fix, until it takes a report.
//
// Threads: Start()/Stop() from the owner; SendOnce() from any thread.
#ifndef TUTTI_SERVICES_STAGER_NODE_REPORTER_H_
#define TUTTI_SERVICES_STAGER_NODE_REPORTER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "services/stager/metrics.h"
#include "services/stager/stager_core.h"
#include "tutti/v1/packer.grpc.pb.h"

namespace tutti::stager {

struct NodeReporterOptions {
  // How often the node is reported (--node_report_interval_ms). Keep it
  // well under the packer's --node_dead_after_s. Default 5 s.
  absl::Duration interval = absl::Seconds(5);
  // Deadline of one report. Default 2 s.
  absl::Duration timeout = absl::Seconds(2);
};

class NodeReporter {
 public:
  // `core` (started) and `metrics` (may be null) must outlive the reporter.
  NodeReporter(std::shared_ptr<grpc::Channel> channel, StagerCore* core, StagerMetrics* metrics,
               NodeReporterOptions options = {});
  ~NodeReporter();

  // The report now; nullopt while the node is not known.
  std::optional<v1::NodeReport> Build() const;
  // Sends one report now (OK without one to send).
  absl::Status SendOnce();

  void Start();
  void Stop();

 private:
  const std::unique_ptr<v1::Packer::Stub> stub_;
  StagerCore* const core_;
  StagerMetrics* const metrics_;
  const NodeReporterOptions options_;
  absl::Notification stop_;
  LogRateLimit limit_{absl::Minutes(1), 3};  // failed reports' lines (the thread's)
  bool told_not_acted_on_ = false;           // the thread's
  std::thread thread_;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_NODE_REPORTER_H_
