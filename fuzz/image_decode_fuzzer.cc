// The full image decoders (libjpeg-turbo, libpng and libwebp behind tutti's
// checks, DCT-reduced JPEG, both resizes, normalise, patchify) over arbitrary
// bytes. The first byte picks the declared format and the target size; the
// decoder must refuse or fill exactly the bytes it was given.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "absl/strings/string_view.h"
#include "services/stager/decode/decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t sel = data[0];
  const absl::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  tutti::stager::PatchifyParams params;
  // Bounded so that a header declaring a huge image is refused, not decoded
  // into gigabytes (the daemon's limits come from the job config).
  params.max_source_pixels = 4 << 20;
  params.max_source_side = 8192;
  params.bf16 = (sel & 0x10) != 0;
  params.reduced_jpeg = (sel & 0x20) == 0;
  params.resize = (sel & 0x40) ? tutti::stager::ResizeMode::kFast : tutti::stager::ResizeMode::kHfBicubic;
  static constexpr tutti::ImageKind kDeclared[4] = {tutti::ImageKind::kJpeg, tutti::ImageKind::kPng,
                                                    tutti::ImageKind::kWebp,
                                                    tutti::ImageKind::kUnknown};
  const uint32_t factor = params.patch * params.merge;
  const uint32_t height = factor * (1 + ((sel >> 2) & 1));
  const uint32_t width = factor * (1 + ((sel >> 3) & 1));
  std::vector<char> out(params.ImageBytes(height, width) + 64, '\x5a');
  auto info = tutti::stager::DecodeImageInto(bytes, "fuzz", kDeclared[sel & 3], height, width,
                                             params, out.data());
  // Nothing written past the image's bytes.
  for (size_t i = out.size() - 64; i < out.size(); ++i) {
    if (out[i] != '\x5a') std::abort();
  }
  if (info.ok() && (info->source_width == 0 || info->source_height == 0)) std::abort();
  return 0;
}
