// The WAV decoder (PCM and float to mono float32 at the job's rate) over
// arbitrary bytes: on success exactly the requested samples, all finite.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "services/stager/decode/batch_layout.h"
#include "services/stager/decode/members.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static constexpr uint32_t kRates[4] = {16000, 8000, 44100, 1};
  const uint32_t rate = kRates[data[0] & 3];
  const uint64_t samples = uint64_t{data[1]} * 37;
  const absl::string_view bytes(reinterpret_cast<const char*>(data + 2), size - 2);
  auto pcm = tutti::stager::DecodeWav(bytes, rate, samples);
  if (pcm.ok()) {
    if (pcm->size() != samples) std::abort();
    for (float v : *pcm) {
      if (!std::isfinite(v)) std::abort();
    }
  }
  return 0;
}
