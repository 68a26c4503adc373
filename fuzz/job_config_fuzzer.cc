// The job-config parser (text-format JobConfig) and everything that reads a
// parsed config: defaults, validation, the fingerprint, the micro-batch
// split, the curriculum, the derived options, and one planned step.
//
// Besides not crashing it checks the bound a config puts on a daemon: every
// config that validates keeps the products the plans are sized by within
// common/job_limits.h (recomputed here from the fields, not by the code under
// test), and a config small enough to plan here plans step 0 over a
// synthetic index with a heap growth proportional to the step's samples,
// sequences and ranks. A config that would make the packer grow without end
// fails one of the two.
#include <malloc.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "common/dtype.h"
#include "common/job_config.h"
#include "common/job_limits.h"
#include "services/packer/bench/synthetic.h"
#include "services/packer/core/job.h"
#include "services/packer/core/planner.h"
#include "services/packer/index/index.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TUTTI_FUZZ_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TUTTI_FUZZ_ASAN 1
#endif
#ifdef TUTTI_FUZZ_ASAN
#include <sanitizer/allocator_interface.h>
#endif

namespace {

using tutti::v1::JobConfig;

[[noreturn]] void Violated(const char* what, uint64_t value, uint64_t limit) {
  std::fprintf(stderr, "job_config_fuzzer: a config that validates has %s %llu, above %llu\n", what,
               static_cast<unsigned long long>(value), static_cast<unsigned long long>(limit));
  std::abort();
}

void Bound(const char* what, uint64_t value, uint64_t limit) {
  if (value > limit) Violated(what, value, limit);
}

// Bytes allocated and not yet freed.
uint64_t HeapInUse() {
#ifdef TUTTI_FUZZ_ASAN
  return __sanitizer_get_current_allocated_bytes();
#else
  const struct mallinfo2 m = ::mallinfo2();
  return m.uordblks + m.hblkhd;
#endif
}

// A validated config's products the plans are sized by, from its fields;
// returns the sequences of a step.
uint64_t CheckProducts(const JobConfig& c) {
  const auto& b = c.batch();
  Bound("world_size", c.world_size(), tutti::kMaxWorldSize);
  Bound("grad_accum", b.grad_accum(), tutti::kMaxGradAccum);
  const auto split = tutti::SplitMicroBatches(b);
  if (!split.ok()) Violated("a micro-batch split that fails", 1, 0);
  const uint64_t per_rank = uint64_t{split->text_micro_batches} * b.text_micro_batch() +
                            uint64_t{split->vl_micro_batches} * b.vl_micro_batch();
  Bound("sequences a rank", per_rank, tutti::kMaxSequencesPerRank);
  Bound("sequences a step", per_rank * c.world_size(), tutti::kMaxSequencesPerStep);
  uint64_t max_pixels = c.vision().max_pixels();
  for (const auto& s : c.curriculum()) {
    Bound("tokens a rank", per_rank * s.seq_len(), tutti::kMaxTokensPerRank);
    max_pixels = std::max(max_pixels, s.max_pixels());
  }
  Bound("curriculum stages", static_cast<uint64_t>(c.curriculum_size()),
        tutti::kMaxCurriculumStages);
  const uint64_t samples = uint64_t{b.text_samples_per_step()} + b.vl_samples_per_step();
  Bound("samples a step", samples, 2 * uint64_t{tutti::kMaxSamplesPerStep});
  Bound("samples in the plan window", samples * c.plan_window(), tutti::kMaxWindowSamples);
  Bound("bytes of one image",
        max_pixels * 3 * c.vision().temporal_patch() * tutti::DTypeSize(c.vision().output_dtype()),
        tutti::kMaxImageBytes);
  Bound("audio samples of a clip", uint64_t{c.audio().sample_rate()} * c.audio().max_seconds(),
        tutti::kMaxAudioSamples);
  Bound("improvement rounds", c.packing().improvement_rounds(), tutti::kMaxImprovementRounds);
  Bound("open bins", c.packing().open_bins(), tutti::kMaxOpenBins);
  Bound("deferred samples", c.overflow().max_deferred_samples(), tutti::kMaxDeferredSamples);
  Bound("epochs", c.epochs(), tutti::kMaxEpochs);
  return per_rank * c.world_size();
}

// A synthetic index of at least `samples` samples (a power of two), built
// once per size.
std::shared_ptr<const tutti::packer::Index> IndexOf(uint64_t samples) {
  static auto* cache = new std::map<uint64_t, std::shared_ptr<const tutti::packer::Index>>();
  uint64_t n = 256;
  while (n < samples) n *= 2;
  auto& index = (*cache)[n];
  if (index == nullptr) {
    tutti::packer::SyntheticOptions o;
    o.samples = n;
    o.text_median_tokens = 300;
    o.max_text_tokens = 3000;
    o.small_max_pixels = 1e6;
    o.big_max_pixels = 2e6;
    o.samples_per_shard = 64;
    auto bytes = tutti::packer::MakeSyntheticIndex(o);
    if (!bytes.ok()) std::abort();
    auto parsed = tutti::packer::Index::FromString(*bytes, "fuzz.idx");
    if (!parsed.ok()) std::abort();
    index = *parsed;
  }
  return index;
}

// Plans step 0 when the step is small enough to plan in a fuzzing run.
void PlanOneStep(const JobConfig& c, uint64_t sequences) {
  const auto& b = c.batch();
  const uint64_t text = b.text_samples_per_step(), vl = b.vl_samples_per_step();
  // A synthetic index holds about 80% text-only and 20% VL samples, and a
  // step must find two steps' draw in each stream.
  const uint64_t samples = std::max(3 * text, 12 * vl);
  if (samples > (1u << 14) || sequences > (1u << 16)) return;
  auto job = tutti::packer::Job::Create(c, IndexOf(samples));
  if (!job.ok()) return;
  const uint64_t before = HeapInUse();
  tutti::packer::Planner planner(*job);
  tutti::packer::StepPlanData plan;
  if (!planner.Plan(0, &plan).ok()) return;
  // What a plan may hold: a few KiB per sample (its images' records and
  // items in both phases), per sequence and per rank.
  const uint64_t after = HeapInUse();
  const uint64_t growth = after - std::min(before, after);
  const uint64_t budget = (uint64_t{64} << 20) + 4096 * (text + vl) + 1024 * sequences +
                          16384 * uint64_t{c.world_size()};
  Bound("heap bytes planning one step", growth, budget);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed =
      tutti::ParseJobConfig(std::string(reinterpret_cast<const char*>(data), size), "fuzz.pbtxt");
  if (!parsed.ok()) return 0;
  JobConfig config = *parsed;
  tutti::ApplyJobDefaults(&config);
  (void)tutti::JobFingerprint(config, "fuzz");
  if (!tutti::ValidateJobConfig(config).ok()) return 0;
  const uint64_t sequences = CheckProducts(config);
  for (uint64_t step : {uint64_t{0}, uint64_t{1} << 20, ~uint64_t{0}}) {
    const tutti::v1::CurriculumStage& stage = tutti::StageAt(config, step);
    (void)tutti::GeometryOptions(config, stage.max_pixels());
  }
  (void)tutti::CostOptions(config);
  PlanOneStep(config, sequences);
  return 0;
}
