// The job-config parser (text-format JobConfig) and everything that reads a
// parsed config before the index: defaults, validation, the fingerprint,
// the micro-batch split, the curriculum and the derived options.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/job_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed =
      tutti::ParseJobConfig(std::string(reinterpret_cast<const char*>(data), size), "fuzz.pbtxt");
  if (!parsed.ok()) return 0;
  tutti::v1::JobConfig config = *parsed;
  tutti::ApplyJobDefaults(&config);
  (void)tutti::JobFingerprint(config);
  if (!tutti::ValidateJobConfig(config).ok()) return 0;
  (void)tutti::SplitMicroBatches(config.batch());
  for (uint64_t step : {uint64_t{0}, uint64_t{1} << 20, ~uint64_t{0}}) {
    const tutti::v1::CurriculumStage& stage = tutti::StageAt(config, step);
    (void)tutti::GeometryOptions(config, stage.max_pixels());
  }
  (void)tutti::CostOptions(config);
  return 0;
}
