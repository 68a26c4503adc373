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

// What loading took: time, and memory (the index's mapped file and heap,
// and the heap the job built over it took, measured as the allocator's
// growth while it was built).
struct LoadJobStats {
  double index_seconds = 0;
  double job_seconds = 0;
  uint64_t samples = 0;
  uint64_t index_mapped_bytes = 0;
  uint64_t index_heap_bytes = 0;
  uint64_t job_heap_bytes = 0;
};

// FAILED_PRECONDITION saying to re-run `tutti index` when the index at
// `path` was built with placeholder ids but records no placeholder
// positions (a tutti before MPOS): its interleaved documents would be
// split and truncated as if their runs led.
absl::Status CheckPlaceholderPositions(const Index& index, const std::string& path);

// Reads a text JobConfig, applies defaults, replaces index_path with
// `index_override` when that is not empty, loads the index and creates the
// job. Errors name the file and the fix. `edit`, when given, changes the
// config before the defaults are applied (e.g. `tutti plan --world-size`).
// `stats` (may be null) receives the time and memory loading took.
absl::StatusOr<std::shared_ptr<const Job>> LoadJob(
    const std::string& config_path, const std::string& index_override,
    const JobOptions& options = {}, const std::function<void(v1::JobConfig*)>& edit = nullptr,
    LoadJobStats* stats = nullptr);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_LOAD_JOB_H_
