// `tutti gen-dataset`: writes a synthetic WebDataset (tar shards) that looks
// like VLM training data: mostly text-only samples, the rest with 1-4 real
// JPEG/PNG/WebP images at a realistic resolution mix, optional WAV audio, and
// pre-tokenised text in `<key>.json` ({"input_ids": [...]}). The mix is the
// seed workload's by default (common/workload.h), as in the synthetic
// indexes the simulator and the packer's benchmarks draw.
//
// Member names: `<key>.json`, `<key>.<i>.jpg|png|webp` (i = image index from
// 0), `<key>.wav`. Keys are the global sample index, 9 digits. Shards are
// `shard-000000.tar`, ... Output is a pure function of the options (not of
// the thread count): the same seed gives byte-identical shards.
#ifndef TUTTI_TOOLS_DATAGEN_DATASET_GEN_H_
#define TUTTI_TOOLS_DATAGEN_DATASET_GEN_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/workload.h"
#include "tools/datagen/synth_media.h"

namespace tutti::datagen {

// The first id reserved for image/audio marker tokens (Qwen2 vocabulary);
// generated text tokens stay below it.
inline constexpr uint32_t kFirstSpecialTokenId = 151640;

struct GenDatasetOptions {
  std::string out_dir;               // required; created if missing
  uint64_t samples = 1000;           // samples in the dataset
  uint32_t samples_per_shard = 256;  // samples per tar shard (last may hold fewer)
  double text_fraction = 1 - kSeedWorkload.vl_fraction;  // samples without images
  double audio_fraction = 0.0;  // samples that also carry `<key>.wav` (drawn independently)
  // Resolution mix (the seed's training set): (1 - large_fraction) of images
  // log-uniform in area between the workload's min_pixels and 2 MP,
  // large_fraction between 2 and 16 MP.
  double large_fraction = kSeedWorkload.big_image_fraction;
  double max_megapixels = kSeedWorkload.big_max_pixels / 1e6;  // cap on any image's area;
                                                               // images above it are redrawn
                                                               // in [cap/2, cap]
  // Image formats with weights, "jpg:7,png:2,webp:1"; a name without ":w" weighs 1.
  std::string formats = "jpg:7,png:2,webp:1";
  uint64_t seed = 1;
  uint32_t threads = 0;  // encoder threads; 0 = all cores
  // Text tokens of a text-only sample: log-normal with this median, of a
  // sample with images with vl_text_tokens_median, both with this log-space
  // sigma.
  uint32_t text_tokens_median = static_cast<uint32_t>(kSeedWorkload.text_median_tokens);
  uint32_t vl_text_tokens_median = static_cast<uint32_t>(kSeedWorkload.vl_text_median_tokens);
  double text_tokens_sigma = kSeedWorkload.text_sigma;
  uint32_t max_text_tokens = 16384;    // ... clamped to [4, this]
  uint32_t audio_sample_rate = 16000;  // WAV: PCM16 mono, 1-30 s
  EncodeOptions encode;                // JPEG/WebP quality, PNG compression
  bool force = false;                  // write into a non-empty out_dir (replacing shard-*.tar)
};

// Image formats and their relative weights.
struct FormatMix {
  std::vector<ImageKind> kinds;
  std::vector<double> weights;  // same length, positive
};
absl::StatusOr<FormatMix> ParseFormats(absl::string_view spec);

// Everything about one sample, drawn from (seed, index) alone.
struct SampleSpec {
  uint64_t index = 0;
  std::string key;
  std::vector<int32_t> input_ids;
  std::vector<ImageSpec> images;
  uint32_t audio_ms = 0;  // 0: no audio
  uint64_t audio_seed = 0;
};
SampleSpec PlanSample(const GenDatasetOptions& opts, const FormatMix& formats, uint64_t index);

// The sample's tar records (headers and padded data, no end-of-archive
// marker): `<key>.json`, then images, then audio.
absl::StatusOr<std::string> RenderSampleRecords(const GenDatasetOptions& opts,
                                                const SampleSpec& spec);

// Checks options; INVALID_ARGUMENT names the option and the accepted range.
absl::Status ValidateGenOptions(const GenDatasetOptions& opts);

struct GenProgress {
  uint64_t samples_done = 0;
  uint64_t samples_total = 0;
  uint64_t shards_done = 0;
  uint64_t shards_total = 0;
  uint64_t bytes_written = 0;
  double elapsed_seconds = 0;
};

struct GenDatasetStats {
  uint64_t samples = 0;
  uint64_t text_only = 0;  // no image and no audio
  uint64_t with_images = 0;
  uint64_t with_audio = 0;
  uint64_t images = 0;
  std::array<uint64_t, 4> images_by_kind{};  // indexed by ImageKind
  uint64_t large_images = 0;                 // above 2 MP
  double image_megapixels = 0;               // summed
  double max_image_megapixels = 0;
  uint64_t text_tokens = 0;
  uint64_t audio_ms = 0;
  uint64_t bytes = 0;  // shard bytes written
  std::vector<std::string> shards;
  double elapsed_seconds = 0;
};

// Writes the dataset. Refuses (FAILED_PRECONDITION) a non-empty out_dir
// unless opts.force, in which case existing `shard-*.tar` files are replaced
// and other files are left alone. Each shard is written to a temporary name
// and renamed into place when complete. `progress` is called from the calling
// thread after every sample.
absl::StatusOr<GenDatasetStats> GenerateDataset(
    const GenDatasetOptions& opts, const std::function<void(const GenProgress&)>& progress = {});

// "shard-000042.tar"
std::string ShardName(uint64_t shard);

}  // namespace tutti::datagen

#endif  // TUTTI_TOOLS_DATAGEN_DATASET_GEN_H_
