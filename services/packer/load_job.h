// Loading a job from files: the config file and the index it names. The
// planning core (core/) takes both in memory; this is where they are read.
#ifndef TUTTI_SERVICES_PACKER_LOAD_JOB_H_
#define TUTTI_SERVICES_PACKER_LOAD_JOB_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/packer/core/job.h"

namespace tutti::packer {

// Reads a text JobConfig, applies defaults, replaces index_path with
// `index_override` when that is not empty, loads the index and creates the
// job. Errors name the file and the fix. `edit`, when given, changes the
// config before the defaults are applied (e.g. `tutti plan --world-size`).
absl::StatusOr<std::shared_ptr<const Job>> LoadJob(
    const std::string& config_path, const std::string& index_override,
    const JobOptions& options = {}, const std::function<void(v1::JobConfig*)>& edit = nullptr);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_LOAD_JOB_H_
