// A job: the validated configuration together with the index it plans from,
// and everything derived from both once (micro-batch layout, epoch length,
// per-stage statistics, the packing strategy and dispatcher). Creating a Job
// runs every index-dependent check, so a Planner over it only fails for a
// step outside the dataset or a deferral queue the data cannot drain.
#ifndef TUTTI_SERVICES_PACKER_CORE_JOB_H_
#define TUTTI_SERVICES_PACKER_CORE_JOB_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/job_config.h"
#include "services/packer/core/costs.h"
#include "services/packer/core/dispatcher.h"
#include "services/packer/core/home_staging.h"
#include "services/packer/core/mixture.h"
#include "services/packer/core/overflow.h"
#include "services/packer/core/packing.h"
#include "services/packer/index/index.h"
#include "tutti/v1/job.pb.h"

namespace tutti::packer {

struct JobOptions {
  // Refuse a configuration whose expected sequence fill (mean tokens per
  // sample x samples per step / sequence capacity) exceeds this for either
  // modality at any curriculum stage. Default 0.95.
  double max_expected_fill = 0.95;
  // Post-balancing: node-aware placement (false: the node-oblivious
  // baseline benchmarks compare against). Default true; not job
  // configuration, so every daemon plans alike.
  bool node_aware = true;
  // Post-balancing by a peer strategy (lpt, kk, multipack, sequential)
  // instead of tutti's node-aware re-deal (MakePeerRedealDispatcher): the
  // baselines `tutti bench packer --post-balancing` compares against.
  // Default empty (tutti's own); not job configuration.
  std::string post_balancing_peer;
  // With locality: nodes that hold nothing from a step on (home_staging.h).
  // Not job configuration: the daemon's --node_removals, which a restarted
  // packer must be given alike to plan the same steps. Default none.
  std::vector<NodeRemoval> node_removals;
};

// Index statistics at one curriculum stage.
struct StageStats {
  uint64_t start_step = 0;
  uint64_t max_pixels = 0;
  uint32_t seq_len = 0;
  double mean_text_tokens = 0;  // LLM tokens per text-only sample
  double mean_vl_tokens = 0;    // LLM tokens per VL sample
  uint32_t max_tokens = 0;      // largest sample
  double text_fill = 0;         // expected fill of text sequences
  double vl_fill = 0;
  // Documents longer than seq_len, and what the overflow policy makes of
  // them: per stream (0 text, 1 VL) the documents it skips.
  uint64_t long_documents = 0;
  uint64_t skipped[2] = {0, 0};
  // With a mixture: per source and stream, the mean LLM tokens of a sample
  // (the stream means above are then the heaviest mix of the schedule).
  std::vector<double> source_mean_tokens[2];
};

class Job {
 public:
  // `config` must have defaults applied (ApplyJobDefaults). Fails with
  // INVALID_ARGUMENT / FAILED_PRECONDITION naming the value and the fix.
  static absl::StatusOr<std::shared_ptr<const Job>> Create(v1::JobConfig config,
                                                           std::shared_ptr<const Index> index,
                                                           const JobOptions& options = {});

  const v1::JobConfig& config() const { return config_; }
  const Index& index() const { return *index_; }
  const std::shared_ptr<const Index>& index_ptr() const { return index_; }
  const std::string& fingerprint() const { return fingerprint_; }

  uint32_t world_size() const { return config_.world_size(); }
  uint32_t ranks_per_node() const { return config_.ranks_per_node(); }
  const MicroBatchSplit& split() const { return split_; }
  uint32_t text_seqs_per_rank() const { return text_seqs_; }
  uint32_t vl_seqs_per_rank() const { return vl_seqs_; }
  // Steps until every sample of both streams was drawn once (the slower
  // stream's epoch; the other one cycles on its own meanwhile), and until
  // `epochs` times (0 = unlimited). sampler.h: StepsForEpochs. With a
  // mixture a stream's epoch is the sum of its sources' source-epochs
  // (Mixture::epoch_samples): each source is drawn by its weight, so one
  // smaller than its share repeats and a larger one is taken in part.
  uint64_t steps_per_epoch() const { return steps_per_epoch_; }
  uint64_t total_steps() const { return total_steps_; }

  // The stage in force at `step` (index into config().curriculum()).
  uint32_t StageIndex(uint64_t step) const;
  const StageCoster& coster(uint32_t stage) const { return costers_[stage]; }
  const std::vector<StageStats>& stage_stats() const { return stats_; }

  const PackingStrategy& strategy() const { return *strategy_; }
  // overflow.* with defaults (overflow.h).
  const OverflowPolicy& overflow() const { return overflow_; }
  // Colocated first-fit packing (overflow.h) for a step the dispatcher
  // cannot pack: it packs every set the planner admits.
  const Dispatcher& fallback_dispatcher() const { return *fallback_dispatcher_; }
  // Post-balancing when post_balancing.enabled, else colocated (dispatch.h).
  const Dispatcher& dispatcher() const { return *dispatcher_; }
  const DispatcherOptions& dispatcher_options() const { return dispatcher_options_; }
  bool post_balancing() const { return config_.post_balancing().enabled(); }
  // What StepPlan.strategy reports: the packing strategy, or
  // "post-balancing/fast" (or ".../ilp") when the dispatcher places samples.
  std::string plan_strategy() const;
  // Bytes of one pixel_values row: 3 x temporal_patch x patch_size^2 x dtype.
  uint64_t pixel_row_bytes() const { return pixel_row_bytes_; }

  // The samples each stream draws from: the index's streams less what the
  // stager would refuse, so a sample it cannot serve is never planned: an
  // image over vision.max_source_pixels / max_source_side, more images than
  // vision.max_images_per_sample, or text with a token count but no token
  // ids (a k.txt member; the stager does not tokenise).
  absl::Span<const uint32_t> text_samples() const { return text_samples_; }
  absl::Span<const uint32_t> vl_samples() const { return vl_samples_; }
  // Samples left out of the streams, by reason ("image_too_large",
  // "too_many_images", "no_token_ids"), and the first one of each, described.
  const std::map<std::string, uint64_t>& unservable() const { return unservable_; }
  const std::map<std::string, std::string>& unservable_examples() const {
    return unservable_examples_;
  }

  // The shards' home nodes by step when locality is on (home_replication >
  // 0), else null: every shard counts as staged on every node.
  const HomeStaging* homes() const { return homes_.get(); }

  // The mixture (null: the index's text-only and VL streams are the two
  // sources "text" and "vl").
  const Mixture* mixture() const { return mixture_.get(); }
  // Sources samples are drawn from (PlannedSample::source indexes them).
  uint32_t num_sources() const { return mixture_ ? mixture_->num_sources() : 2; }
  std::string source_name(uint32_t source) const;
  // What becomes of a document of this source longer than seq_len.
  LongDocuments long_documents(uint32_t source) const {
    return mixture_ ? mixture_->source(source).long_documents : overflow_.long_documents;
  }
  // The samples at stream positions pos[k] (k < count) of stream `vl`, and
  // their sources: the stream's permutations, or the mixture's draw.
  void DrawSamples(bool vl, const uint64_t* pos, size_t count, uint32_t* sample,
                   uint8_t* source) const;

  // OK when `step` lies within the dataset; OUT_OF_RANGE naming it otherwise.
  absl::Status CheckStep(uint64_t step) const;
  // Human-readable description of a sample: "shard/key".
  std::string DescribeSample(uint32_t sample) const;

 private:
  Job() = default;
  absl::Status Init(const JobOptions& options);
  absl::Status CheckStage(uint32_t i, const JobOptions& options);
  // Fills the streams and unservable_ from the index and the config.
  void FilterStreams();
  // With a mixture: the sources, the epochs and the costers' ceilings.
  absl::Status InitMixture();
  std::vector<MediaCeiling> Ceilings() const;
  // Why the stager would refuse sample s; empty when it would serve it.
  const char* UnservableReason(uint32_t s) const;
  // " that the stager can serve (left out: ...)" when samples were left out.
  std::string UnservableNote() const;

  v1::JobConfig config_;
  std::shared_ptr<const Index> index_;
  std::string fingerprint_;
  MicroBatchSplit split_;
  uint32_t text_seqs_ = 0;
  uint32_t vl_seqs_ = 0;
  uint64_t steps_per_epoch_ = 0;
  uint64_t total_steps_ = 0;
  uint64_t pixel_row_bytes_ = 0;
  std::vector<StageCoster> costers_;
  std::vector<StageStats> stats_;
  std::unique_ptr<PackingStrategy> strategy_;
  DispatcherOptions dispatcher_options_;
  std::unique_ptr<Dispatcher> dispatcher_;
  OverflowPolicy overflow_;
  std::unique_ptr<PackingStrategy> fallback_strategy_;
  std::unique_ptr<PackingStrategy> peer_;  // JobOptions::post_balancing_peer
  std::unique_ptr<Dispatcher> fallback_dispatcher_;
  // The index's own streams, or the filtered copies below when some sample
  // is left out.
  absl::Span<const uint32_t> text_samples_;
  absl::Span<const uint32_t> vl_samples_;
  std::vector<uint32_t> text_kept_, vl_kept_;
  std::map<std::string, uint64_t> unservable_;
  std::map<std::string, std::string> unservable_examples_;
  std::unique_ptr<const Mixture> mixture_;
  std::shared_ptr<const HomeStaging> homes_;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_JOB_H_
