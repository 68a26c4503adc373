// `--locality-record FILE` and `--node-removals NODE@STEP,...` of the commands
// that plan a job as tutti-packerd does (`tutti plan`, `tutti simulate`): the
// node changes the packer planned with, through the packer's own code
// (ParseNodeRemovals, LoadLocalityReplay), so the plans are the ones it served.
#ifndef TUTTI_TOOLS_LOCALITY_REPLAY_H_
#define TUTTI_TOOLS_LOCALITY_REPLAY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/packer/core/job.h"
#include "services/packer/core/locality_schedule.h"
#include "tools/cli.h"

namespace tutti::tools {

struct LocalityReplayFlags {
  std::string record;    // --locality-record
  std::string removals;  // --node-removals

  void Register(Cli* cli);
  // The job options with the removals (as tutti-packerd --node_removals);
  // INVALID_ARGUMENT naming the flag when the list is malformed.
  absl::Status AddTo(packer::JobOptions* options) const;
  // The homes by step after the removals in `options` (AddTo's) and the
  // record's changes (null without a record: the job's own homes under the
  // removals); FAILED_PRECONDITION when the
  // job has no locality or the record is another job's, NOT_FOUND when the
  // file cannot be read, each naming the file and what to give instead.
  absl::StatusOr<std::unique_ptr<packer::LocalitySchedule>> Load(
      std::shared_ptr<const packer::Job> job, const packer::JobOptions& options) const;
};

}  // namespace tutti::tools

#endif  // TUTTI_TOOLS_LOCALITY_REPLAY_H_
