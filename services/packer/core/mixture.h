// A job's mixture (job.proto MixtureConfig; services/packer/README.md,
// "Mixtures"): its sources resolved against the index, the weights by step
// as each stream's apportionment (apportion.h), and the draw: which sample
// of which source stands at each stream position.
//
// A stream (text-only or VL) still draws N samples a step at positions
// [step x N, (step + 1) x N), as without a mixture, so deferral and its
// recovery (planner.h) work on positions unchanged. The step's N positions
// are dealt to its sources by the apportionment's counts, interleaved (the
// k-th of a source's c samples at about (k + 1/2) / c of the step), and a
// source's samples are its own stream, the k-th of the step being its
// position before(step) + k: a StreamSampler per source and stream (its own
// permutations, keyed by the seed and the source's name, epochs of
// max_samples_per_epoch or all of its samples, blocks where the
// apportionment says its steps' draws lie). So every source cycles its own
// epochs, each sample once per source-epoch and never twice in a step, and
// a step's draw is a function of (seed, step, mixture) alone.
#ifndef TUTTI_SERVICES_PACKER_CORE_MIXTURE_H_
#define TUTTI_SERVICES_PACKER_CORE_MIXTURE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "services/packer/core/apportion.h"
#include "services/packer/core/overflow.h"
#include "services/packer/core/sampler.h"
#include "services/packer/index/index.h"
#include "tutti/v1/job.pb.h"

namespace tutti::packer {

// Index meta key naming, for an index combined from several index files,
// which shards came from which file: "path\tfirst_shard\tshards\tprefix"
// (prefix: what the combined shard names have in front of the file's own).
inline constexpr char kCombinedIndexMeta[] = "combined_index";

// A source's samples in one stream.
struct SourcePart {
  // Its samples as ranges [first, end) of the job's stream list, ascending.
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  std::vector<uint64_t> offsets;  // samples before each range
  uint64_t n = 0;
  uint64_t epoch_size = 0;  // a source-epoch: min(n, max_samples_per_epoch)
  uint64_t key = 0;         // StreamOptions::key
  int32_t slot = -1;        // its index among the stream's sources; -1: none
  // The stream-list index of its local sample i.
  uint32_t ListIndex(uint64_t i) const;
};

struct MixtureSource {
  std::string name;
  SourcePart part[2];                                    // text-only, VL
  uint64_t max_pixels = 0;                               // ceiling; 0 none
  LongDocuments long_documents = LongDocuments::kSplit;  // resolved
  // Shard ranges of the index it draws from, [first, end).
  std::vector<std::pair<uint32_t, uint32_t>> shards;
};

// The weights in force from a step on (a stage, or a step of a ramp).
struct MixtureSegment {
  uint64_t start_step = 0;
  int stage = -1;               // mixture.stages index; -1: the sources' own weights
  std::vector<double> weights;  // per source
};

class Mixture {
 public:
  // `streams`: the job's text-only and VL stream lists (ascending sample
  // ids, what the stager can serve). `per_step`: T and V. FAILED_PRECONDITION
  // or INVALID_ARGUMENT naming the field and the fix when a source selects no
  // samples, lacks the modality it names, shares shards with another, or a
  // stream the batch needs has no source with weight at some step, or a
  // source would draw a sample twice in one step.
  static absl::StatusOr<std::unique_ptr<const Mixture>> Create(
      const v1::JobConfig& config, const Index& index, const absl::Span<const uint32_t> streams[2],
      const uint32_t per_step[2], LongDocuments job_long_documents);

  uint32_t num_sources() const { return static_cast<uint32_t>(sources_.size()); }
  const MixtureSource& source(uint32_t i) const { return sources_[i]; }
  // The sources a stream draws from, by slot.
  const std::vector<uint32_t>& stream_sources(bool vl) const { return stream_sources_[vl]; }
  // The stream's apportionment (slots), or null when it draws nothing.
  const Apportionment* apportionment(bool vl) const { return apportion_[vl].get(); }
  const std::vector<MixtureSegment>& segments() const { return segments_; }
  // The samples a stream's epoch counts: the sum of its sources' epochs
  // (sources with a weight somewhere).
  uint64_t epoch_samples(bool vl) const { return epoch_samples_[vl]; }

  // sample[k] and source[k] of stream positions pos[k], k < count.
  void Draw(bool vl, const uint64_t* pos, size_t count, uint32_t* sample, uint8_t* source) const;
  // Source `source`'s samples drawn by stream `vl` before `step`.
  uint64_t Before(bool vl, uint32_t source, uint64_t step) const;
  // Source `source`'s share of stream `vl`'s draw at `step` (samples).
  double Share(bool vl, uint32_t source, uint64_t step) const;

  // What decided the draws up to each stage (JobInfo.mixture_history):
  // (start_step, digest) for the sources' weights (step 0) and every stage.
  const std::vector<std::pair<uint64_t, std::string>>& history() const { return history_; }

 private:
  Mixture() = default;
  absl::Status Resolve(const v1::JobConfig& config, const Index& index,
                       const absl::Span<const uint32_t> streams[2]);
  void BuildSegments(const v1::JobConfig& config);
  absl::Status BuildStreams(const v1::JobConfig& config,
                            const absl::Span<const uint32_t> streams[2],
                            const uint32_t per_step[2]);
  void BuildHistory(const v1::JobConfig& config);
  // Positions [0, N) of a step: slot and k (the slot's k-th of the step).
  struct Layout {
    std::vector<uint16_t> slot;
    std::vector<uint32_t> k;
    std::vector<uint64_t> before;  // per slot
  };
  void LayoutOf(bool vl, uint64_t step, Layout* out) const;

  uint64_t seed_ = 0;
  uint64_t id_ = 0;  // distinguishes instances in per-thread caches
  uint32_t per_step_[2] = {0, 0};
  std::vector<MixtureSource> sources_;
  std::vector<uint32_t> stream_sources_[2];
  std::vector<MixtureSegment> segments_;
  std::unique_ptr<Apportionment> apportion_[2];
  // The blocks (steps' draws) of every source part, for its sampler.
  std::vector<std::unique_ptr<StepBlocks>> blocks_[2];
  uint64_t epoch_samples_[2] = {0, 0};
  absl::Span<const uint32_t> streams_[2];
  std::vector<std::pair<uint64_t, std::string>> history_;
};

// 64-bit FNV-1a of a name: a source's key, the same on every platform.
uint64_t NameKey(const std::string& name);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_MIXTURE_H_
