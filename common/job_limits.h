// The bounds of every numeric field of a job config, and of the products the
// daemons size their memory and work by (sequences a step, tokens a rank,
// samples held in the plan window, bytes of one image). ValidateJobConfig
// checks them, so a config that loads plans and stages in bounded memory
// and time; the error names the field, its value and its range.
//
// The ranges are far above any real job (the largest in the benchmarks:
// 2,560 ranks, 32,768-token sequences, 16 MP images) and far below what
// would exhaust a node.
#ifndef TUTTI_COMMON_JOB_LIMITS_H_
#define TUTTI_COMMON_JOB_LIMITS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "tutti/v1/job.pb.h"

namespace tutti {

// Single fields (job.proto).
inline constexpr uint32_t kMaxWorldSize = 65536;
inline constexpr uint32_t kMaxRanksPerNode = 1024;
inline constexpr uint32_t kMaxEpochs = 1000000;
inline constexpr uint32_t kMaxPlanWindow = 256;
inline constexpr uint32_t kMaxSampleDeadlineMs = 600000;  // 10 minutes
inline constexpr uint32_t kMaxSamplesPerStep = 1u << 20;  // per stream
inline constexpr uint32_t kMaxGradAccum = 1024;
inline constexpr uint32_t kMaxMicroBatch = 1024;  // sequences
inline constexpr uint32_t kMaxRatioTerm = 65536;  // each side of text_vl_ratio
inline constexpr uint32_t kMaxCurriculumStages = 64;
inline constexpr uint32_t kMinSeqLen = 16;
inline constexpr uint32_t kMaxSeqLen = 1u << 20;
inline constexpr uint64_t kMaxPixels = uint64_t{1} << 26;  // 64 MP planned
inline constexpr uint32_t kMaxPatchSize = 128;
inline constexpr uint32_t kMaxMergeSize = 8;
inline constexpr uint32_t kMaxTemporalPatch = 16;
inline constexpr double kMaxAspectRatio = 1000;
inline constexpr uint64_t kMaxSourcePixels = uint64_t{1} << 30;  // decoded at most
inline constexpr uint32_t kMaxSourceSide = 65535;                // the index keeps 16-bit sides
inline constexpr uint32_t kMaxTokenId = 0x7fffffff;              // input_ids are int32
inline constexpr uint32_t kMaxImagesPerSampleLimit = 1024;
inline constexpr uint32_t kMaxPatchesPerChunk = 1u << 24;
inline constexpr uint32_t kMaxOpenBins = 1024;
inline constexpr uint32_t kMaxImprovementRounds = 4096;
inline constexpr uint32_t kMaxHiddenSize = 65536;
inline constexpr uint32_t kMinAudioRate = 1000;
inline constexpr uint32_t kMaxAudioRate = 384000;
inline constexpr uint32_t kMaxFramesPerToken = 1000;
inline constexpr uint32_t kMaxAudioSeconds = 3600;
inline constexpr double kMaxCostCoefficient = 1e9;
inline constexpr uint32_t kMaxDeferredSamples = 1u << 22;

// Products.
// Sequences one rank holds a step (text and VL micro-batches together).
inline constexpr uint64_t kMaxSequencesPerRank = 4096;
// Sequences of a step over all ranks: what a plan lays out.
inline constexpr uint64_t kMaxSequencesPerStep = uint64_t{1} << 21;
// Tokens of one rank's step at the longest seq_len: its batch's buffers.
inline constexpr uint64_t kMaxTokensPerRank = uint64_t{1} << 26;
// Samples of both streams in the plans held at once (plan_window steps).
inline constexpr uint64_t kMaxWindowSamples = uint64_t{1} << 23;
// pixel_values bytes of one image at the largest max_pixels.
inline constexpr uint64_t kMaxImageBytes = uint64_t{1} << 31;
// Audio samples of one clip (audio.sample_rate x audio.max_seconds).
inline constexpr uint64_t kMaxAudioSamples = uint64_t{1} << 26;

// OK when every field and product above lies in its range (after
// ApplyJobDefaults); INVALID_ARGUMENT naming the first that does not, its
// range and what to change.
absl::Status CheckJobLimits(const v1::JobConfig& config);

}  // namespace tutti

#endif  // TUTTI_COMMON_JOB_LIMITS_H_
