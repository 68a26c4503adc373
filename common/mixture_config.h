// The checks of a job's mixture (tutti.v1.MixtureConfig) that need no index:
// names, weights, the schedule's order, ramps and per-source settings. What
// needs the index (a source without samples, sources sharing shards, a
// stream no source can fill) is checked when the packer creates the job.
#ifndef TUTTI_COMMON_MIXTURE_CONFIG_H_
#define TUTTI_COMMON_MIXTURE_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "tutti/v1/job.pb.h"

namespace tutti {

// Bounds of a mixture (job.proto).
inline constexpr int kMaxMixtureSources = 256;
inline constexpr int kMaxMixtureStages = 1024;
inline constexpr int kMaxShardPrefixes = 64;
inline constexpr size_t kMaxShardPrefixBytes = 256;
inline constexpr size_t kMaxSourceNameBytes = 64;
inline constexpr double kMaxSourceWeight = 1e9;
inline constexpr uint64_t kMaxSamplesPerEpoch = uint64_t{1} << 32;
inline constexpr uint64_t kMaxRampSteps = 1000000000;

// OK when config.mixture() is unset or well-formed; INVALID_ARGUMENT naming
// the field (mixture.sources[i].weight, mixture.stages[k].start_step, ...)
// and the fix otherwise.
absl::Status ValidateMixtureConfig(const v1::JobConfig& config);

}  // namespace tutti

#endif  // TUTTI_COMMON_MIXTURE_CONFIG_H_
