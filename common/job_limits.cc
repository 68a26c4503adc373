#include "common/job_limits.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/job_config.h"
#include "common/status.h"

namespace tutti {
namespace {

// The first field outside its range, described.
class Checker {
 public:
  // `what`: what the field counts, for the message.
  void Field(const std::string& field, uint64_t value, uint64_t lo, uint64_t hi, const char* what) {
    if (!status_.ok() || (value >= lo && value <= hi)) return;
    status_ = absl::InvalidArgumentError(absl::StrCat(field, " ", value, " is outside its range ",
                                                      lo, "..", hi, " (", what,
                                                      "); set it within the range"));
  }
  void Real(const std::string& field, double value, double lo, double hi, const char* what) {
    if (!status_.ok() || (std::isfinite(value) && value >= lo && value <= hi)) return;
    status_ = absl::InvalidArgumentError(absl::StrCat(field, " ", value, " is outside its range ",
                                                      lo, "..", hi, " (", what,
                                                      "); set it within the range"));
  }
  void Fail(const std::string& message) {
    if (status_.ok()) status_ = absl::InvalidArgumentError(message);
  }
  // A product of fields above its limit; `fix` says which to lower.
  void Product(const std::string& what, uint64_t value, uint64_t limit, const std::string& terms,
               const std::string& fix) {
    if (!status_.ok() || value <= limit) return;
    status_ = absl::InvalidArgumentError(absl::StrCat(what, " would be ", value, " (", terms,
                                                      "), above the limit ", limit, "; ", fix));
  }
  absl::Status status() const { return status_; }

 private:
  absl::Status status_;
};

}  // namespace

absl::Status CheckJobLimits(const v1::JobConfig& c) {
  Checker k;
  k.Field("world_size", c.world_size(), 1, kMaxWorldSize, "ranks in the job");
  k.Field("ranks_per_node", c.ranks_per_node(), 1, kMaxRanksPerNode, "ranks on each node");
  k.Field("epochs", c.epochs(), 0, kMaxEpochs, "0 = unlimited");
  k.Field("plan_window", c.plan_window(), 1, kMaxPlanWindow, "steps planned ahead");
  k.Field("sample_deadline_ms", c.sample_deadline_ms(), 1, kMaxSampleDeadlineMs,
          "milliseconds per read and decode");

  const v1::VisionConfig& v = c.vision();
  k.Field("vision.patch_size", v.patch_size(), 1, kMaxPatchSize, "pixels per patch side");
  k.Field("vision.merge_size", v.merge_size(), 1, kMaxMergeSize, "patches merged per side");
  k.Field("vision.temporal_patch", v.temporal_patch(), 1, kMaxTemporalPatch,
          "frames per temporal patch");
  k.Field("vision.min_pixels", v.min_pixels(), 1, kMaxPixels, "pixels");
  k.Field("vision.max_pixels", v.max_pixels(), 1, kMaxPixels, "pixels");
  k.Real("vision.max_aspect_ratio", v.max_aspect_ratio(), 1, kMaxAspectRatio, "long side / short");
  for (int i = 0; i < v.mean_size(); ++i) {
    k.Real(absl::StrCat("vision.mean[", i, "]"), v.mean(i), -1e3, 1e3, "a channel mean");
  }
  for (int i = 0; i < v.std_size(); ++i) {
    k.Real(absl::StrCat("vision.std[", i, "]"), v.std(i), 1e-6, 1e3, "a channel std");
  }
  k.Field("vision.max_source_pixels", v.max_source_pixels(), 1, kMaxSourcePixels,
          "pixels of a source image");
  k.Field("vision.max_source_side", v.max_source_side(), 1, kMaxSourceSide,
          "pixels of a source image's side");
  k.Field("vision.vision_start_id", v.vision_start_id(), 0, kMaxTokenId, "a token id");
  k.Field("vision.image_pad_id", v.image_pad_id(), 0, kMaxTokenId, "a token id");
  k.Field("vision.vision_end_id", v.vision_end_id(), 0, kMaxTokenId, "a token id");
  k.Field("vision.resize", static_cast<uint64_t>(v.resize()), 0, v1::ResizeMode_MAX,
          "a ResizeMode");
  k.Field("vision.max_images_per_sample", v.max_images_per_sample(), 0, kMaxImagesPerSampleLimit,
          "images; 0 = the default 64");

  const v1::AudioConfig& a = c.audio();
  k.Field("audio.sample_rate", a.sample_rate(), kMinAudioRate, kMaxAudioRate, "samples a second");
  k.Field("audio.frames_per_token", a.frames_per_token(), 1, kMaxFramesPerToken,
          "10 ms frames per token");
  k.Field("audio.max_seconds", a.max_seconds(), 1, kMaxAudioSeconds, "seconds of one clip");
  k.Field("audio.audio_start_id", a.audio_start_id(), 0, kMaxTokenId, "a token id");
  k.Field("audio.audio_pad_id", a.audio_pad_id(), 0, kMaxTokenId, "a token id");
  k.Field("audio.audio_end_id", a.audio_end_id(), 0, kMaxTokenId, "a token id");
  k.Product("an audio clip", uint64_t{a.sample_rate()} * a.max_seconds(), kMaxAudioSamples,
            "audio.sample_rate x audio.max_seconds samples",
            "lower audio.max_seconds or audio.sample_rate");

  k.Field("curriculum (stages)", static_cast<uint64_t>(c.curriculum_size()), 1,
          kMaxCurriculumStages, "one per change of max_pixels or seq_len");
  uint64_t max_pixels = 0;
  uint32_t max_seq_len = 0;
  for (int i = 0; i < c.curriculum_size(); ++i) {
    const v1::CurriculumStage& s = c.curriculum(i);
    k.Field(absl::StrCat("curriculum[", i, "].max_pixels"), s.max_pixels(), 1, kMaxPixels,
            "pixels of a planned image");
    k.Field(absl::StrCat("curriculum[", i, "].seq_len"), s.seq_len(), kMinSeqLen, kMaxSeqLen,
            "tokens a sequence");
    max_pixels = std::max(max_pixels, s.max_pixels());
    max_seq_len = std::max(max_seq_len, s.seq_len());
  }
  const uint64_t dtype = std::max<uint64_t>(1, DTypeSize(v.output_dtype()));
  k.Product("one image's pixel_values",
            std::min(max_pixels, kMaxPixels) * 3 * v.temporal_patch() * dtype, kMaxImageBytes,
            absl::StrCat("the largest max_pixels ", max_pixels, " x 3 channels x temporal_patch ",
                         v.temporal_patch(), " x ", dtype, " bytes"),
            "lower max_pixels or vision.temporal_patch");

  const v1::CostModel& cm = c.cost();
  const std::pair<const char*, double> costs[] = {{"cost.vit_linear", cm.vit_linear()},
                                                  {"cost.vit_quadratic", cm.vit_quadratic()},
                                                  {"cost.p_ref", cm.p_ref()},
                                                  {"cost.llm_linear", cm.llm_linear()},
                                                  {"cost.llm_quadratic", cm.llm_quadratic()},
                                                  {"cost.audio_linear", cm.audio_linear()},
                                                  {"cost.audio_quadratic", cm.audio_quadratic()}};
  for (const auto& [name, value] : costs) {
    k.Real(name, value, 0, kMaxCostCoefficient, "a cost coefficient");
  }

  const v1::BatchConfig& b = c.batch();
  k.Field("batch.text_samples_per_step", b.text_samples_per_step(), 0, kMaxSamplesPerStep,
          "text-only samples in a global batch");
  k.Field("batch.vl_samples_per_step", b.vl_samples_per_step(), 0, kMaxSamplesPerStep,
          "vision-language samples in a global batch");
  k.Field("batch.grad_accum", b.grad_accum(), 1, kMaxGradAccum, "micro-batches per rank");
  k.Field("batch.text_micro_batch", b.text_micro_batch(), 1, kMaxMicroBatch,
          "sequences per text micro-batch");
  k.Field("batch.vl_micro_batch", b.vl_micro_batch(), 1, kMaxMicroBatch,
          "sequences per VL micro-batch");
  uint32_t rt = 0, rv = 0;
  if (!b.text_vl_ratio().empty() && ParseRatio(b.text_vl_ratio(), &rt, &rv).ok()) {
    k.Field("batch.text_vl_ratio's text term", rt, 0, kMaxRatioTerm, "sequences");
    k.Field("batch.text_vl_ratio's VL term", rv, 0, kMaxRatioTerm, "sequences");
  }
  k.Field("batch.img_cap_tokens", b.img_cap_tokens(), 0, kMaxSeqLen,
          "image tokens a sequence; 0 = none");
  k.Field("batch.max_patches_per_chunk", b.max_patches_per_chunk(), 1, kMaxPatchesPerChunk,
          "patches an encoder chunk");

  const v1::PackingConfig& p = c.packing();
  k.Field("packing.open_bins", p.open_bins(), 1, kMaxOpenBins, "bins a seed strategy keeps open");
  k.Field("packing.improvement_rounds", p.improvement_rounds(), 1, kMaxImprovementRounds,
          "local-search moves per phase");
  const v1::PostBalancingConfig& pb = c.post_balancing();
  k.Field("post_balancing.hidden_size", pb.hidden_size(), 1, kMaxHiddenSize,
          "the LLM's hidden size");
  const v1::DType e = pb.embedding_dtype();
  if (e != v1::DTYPE_BFLOAT16 && e != v1::DTYPE_FLOAT16 && e != v1::DTYPE_FLOAT32) {
    k.Fail(absl::StrCat("post_balancing.embedding_dtype ", DTypeName(e),
                        " is not an embedding type; use DTYPE_BFLOAT16, DTYPE_FLOAT16 or "
                        "DTYPE_FLOAT32"));
  }
  k.Field("skip_policy", static_cast<uint64_t>(c.skip_policy()), v1::SKIP_POLICY_DROP,
          v1::SKIP_POLICY_SUBSTITUTE, "SKIP_POLICY_DROP or SKIP_POLICY_SUBSTITUTE");
  k.Field("overflow.max_deferred_samples", c.overflow().max_deferred_samples(), 0,
          kMaxDeferredSamples, "samples waiting; 0 = one step's draw");
  RETURN_IF_ERROR(k.status());

  // The products the plans are sized by. Fields are in range here, so none
  // of these overflows 64 bits.
  const uint64_t samples = uint64_t{b.text_samples_per_step()} + b.vl_samples_per_step();
  k.Product("the samples held in the plan window", samples * c.plan_window(), kMaxWindowSamples,
            absl::StrCat("plan_window ", c.plan_window(), " x ", samples, " samples a step"),
            "lower plan_window or the samples per step");
  auto split = SplitMicroBatches(b);
  if (split.ok()) {
    const uint64_t per_rank = uint64_t{split->text_micro_batches} * b.text_micro_batch() +
                              uint64_t{split->vl_micro_batches} * b.vl_micro_batch();
    const std::string terms = absl::StrCat(
        split->text_micro_batches, " text micro-batches x text_micro_batch ", b.text_micro_batch(),
        " + ", split->vl_micro_batches, " VL micro-batches x vl_micro_batch ", b.vl_micro_batch());
    k.Product("a rank's sequences a step", per_rank, kMaxSequencesPerRank, terms,
              "lower batch.grad_accum, text_micro_batch or vl_micro_batch");
    k.Product("a step's sequences", per_rank * c.world_size(), kMaxSequencesPerStep,
              absl::StrCat("world_size ", c.world_size(), " x ", per_rank, " sequences a rank"),
              "lower the sequences per rank (batch.grad_accum, text_micro_batch, vl_micro_batch)");
    k.Product("a rank's tokens a step", per_rank * max_seq_len, kMaxTokensPerRank,
              absl::StrCat(per_rank, " sequences a rank x the longest seq_len ", max_seq_len),
              "lower seq_len or the sequences per rank");
  }
  return k.status();
}

}  // namespace tutti
