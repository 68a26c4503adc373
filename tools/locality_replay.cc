#include "tools/locality_replay.h"

#include <cstdio>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/packer/core/home_staging.h"
#include "services/packer/locality_record.h"

namespace tutti::tools {

void LocalityReplayFlags::Register(Cli* cli) {
  cli->Flag("locality-record", &record,
            "the job's locality record (tutti-packerd --locality_record): plan with the node "
            "changes it holds, as the packer did");
  cli->Flag("node-removals", &removals,
            "NODE@STEP,...: nodes removed from a step on, as tutti-packerd --node_removals (give "
            "the list the packer had)");
}

absl::Status LocalityReplayFlags::AddTo(packer::JobOptions* options) const {
  absl::StatusOr<std::vector<packer::NodeRemoval>> parsed = packer::ParseNodeRemovals(removals);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--node-removals: ", parsed.status().message()));
  }
  options->node_removals = *std::move(parsed);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<packer::LocalitySchedule>> LocalityReplayFlags::Load(
    std::shared_ptr<const packer::Job> job, const packer::JobOptions& options) const {
  if (record.empty()) return nullptr;
  if (job->homes() == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--locality-record ", record,
        ": the job has no locality (locality.home_replication is 0), so no node change applies "
        "to its plans; give the config the packer that wrote the record ran with"));
  }
  if (FILE* f = std::fopen(record.c_str(), "r")) {
    std::fclose(f);
  } else {
    return absl::NotFoundError(absl::StrCat("--locality-record ", record,
                                            " cannot be read; give the file tutti-packerd "
                                            "--locality_record wrote"));
  }
  absl::StatusOr<packer::LocalityReplay> replay =
      packer::LoadLocalityReplay(job, options.node_removals, record);
  if (!replay.ok()) return replay.status();
  return std::move(replay->schedule);
}

}  // namespace tutti::tools
