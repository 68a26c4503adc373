// Loading, defaulting and checking the job configuration (tutti.v1.JobConfig,
// written as a text-format proto).
#ifndef TUTTI_COMMON_JOB_CONFIG_H_
#define TUTTI_COMMON_JOB_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/cost_model.h"
#include "common/smart_resize.h"
#include "tutti/v1/job.pb.h"

namespace tutti {

// Parses a text-format JobConfig; the error names the file, line and field.
absl::StatusOr<v1::JobConfig> ParseJobConfig(const std::string& text, const std::string& origin);
absl::StatusOr<v1::JobConfig> LoadJobConfig(const std::string& path);

// The packing strategies a config may name (packing.strategy): the one table
// of names; the packer maps each to its implementation (MakeStrategy).
const std::vector<std::string>& PackingStrategyNames();

// Fills every unset field with its documented default (see job.proto).
// vision.max_images_per_sample stays 0 when unset (it is part of the job's
// fingerprint, so an unset bound keeps existing jobs' plans): read it with
// MaxImagesPerSample.
void ApplyJobDefaults(v1::JobConfig* config);

// vision.max_images_per_sample, or its default when 0.
inline constexpr uint32_t kDefaultMaxImagesPerSample = 64;
inline uint32_t MaxImagesPerSample(const v1::VisionConfig& v) {
  return v.max_images_per_sample() ? v.max_images_per_sample() : kDefaultMaxImagesPerSample;
}

// Checks what can be checked without the index; messages name field and fix.
absl::Status ValidateJobConfig(const v1::JobConfig& config);
// The cost block alone (part of ValidateJobConfig): finite, non-negative
// constants, a known cost.model whose patch and merge sizes are vision's,
// online_fit's ranges.
absl::Status ValidateCostConfig(const v1::JobConfig& config);

// locality (part of ValidateJobConfig): home_replication at most
// kMaxHomeReplication, node_cache_bytes only with home_replication. Whether
// the nodes can hold the dataset is checked with the index (packer Job).
inline constexpr uint32_t kMaxHomeReplication = 16;
absl::Status ValidateLocalityConfig(const v1::LocalityConfig& locality);

// A stable hex digest of what determines a job's plans: the config
// (deterministic serialization) less index_path (a mixture source's index
// file counted by the order it first appears in), and `index_id`, the
// identity of the index's content (Index::content_id). The same config and
// index give one fingerprint however the index's path is spelled.
std::string JobFingerprint(const v1::JobConfig& config, absl::string_view index_id);

// The curriculum stage in force at `step` (the last with start_step <= step).
const v1::CurriculumStage& StageAt(const v1::JobConfig& config, uint64_t step);

VisionGeometryOptions GeometryOptions(const v1::JobConfig& config, uint64_t max_pixels);
CostModelOptions CostOptions(const v1::JobConfig& config);

// Parses "a:b" into two positive integers.
absl::Status ParseRatio(const std::string& ratio, uint32_t* a, uint32_t* b);

// Micro-batch split per rank: how many of grad_accum micro-batches are text
// and how many VL so that the configured ratio holds exactly.
struct MicroBatchSplit {
  uint32_t text_micro_batches = 0;
  uint32_t vl_micro_batches = 0;
};
absl::StatusOr<MicroBatchSplit> SplitMicroBatches(const v1::BatchConfig& batch);

}  // namespace tutti

#endif  // TUTTI_COMMON_JOB_CONFIG_H_
