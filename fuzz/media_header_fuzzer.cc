// The JPEG / PNG / WebP and WAV header readers over arbitrary bytes: they
// never read outside the input and report only sizes they found.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "common/media_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto image = tutti::ReadImageHeader(bytes);
  if (image.ok() &&
      (image->width == 0 || image->height == 0 || image->kind == tutti::ImageKind::kUnknown)) {
    std::abort();
  }
  auto audio = tutti::ReadWavHeader(bytes);
  if (audio.ok() && audio->sample_rate == 0) std::abort();
  return 0;
}
