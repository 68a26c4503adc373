// Synthetic media with real structure for the dataset generator: images a
// decoder and a resize have to work on (gradients, shapes, rendered text,
// lines, noise), encoded as real JPEG / PNG / WebP with OpenCV, and WAV audio
// (16-bit PCM, mono) made of tones, sweeps and noise.
#ifndef TUTTI_TOOLS_DATAGEN_SYNTH_MEDIA_H_
#define TUTTI_TOOLS_DATAGEN_SYNTH_MEDIA_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/media_header.h"

namespace cv {
class Mat;
}

namespace tutti::datagen {

struct ImageSpec {
  uint32_t width = 0;
  uint32_t height = 0;
  ImageKind format = ImageKind::kJpeg;
  // 1 (grey), 3 (colour) or 4 (colour with alpha; PNG and WebP only).
  uint32_t channels = 3;
  uint64_t seed = 0;  // everything drawn in the picture derives from it
};

struct EncodeOptions {
  int jpeg_quality = 90;    // 0..100
  int webp_quality = 80;    // 1..100
  int png_compression = 3;  // 0..9 (zlib level; 3 is fast with fair size)
};

// Draws the picture described by spec into *out (CV_8UC1/3/4). Deterministic:
// the same spec gives the same pixels.
void RenderImage(const ImageSpec& spec, cv::Mat* out);

// Renders and encodes. INTERNAL naming the spec when OpenCV refuses.
absl::StatusOr<std::string> RenderEncodedImage(const ImageSpec& spec, const EncodeOptions& enc);

// Largest side any generated image has: WebP cannot encode more than 16383.
inline constexpr uint32_t kMaxGeneratedSide = 16383;

// A RIFF/WAVE file, PCM16 mono at sample_rate, duration_ms long, with tones,
// harmonics, a frequency sweep and a little noise, all drawn from seed.
std::string RenderWav(uint32_t duration_ms, uint32_t sample_rate, uint64_t seed);

}  // namespace tutti::datagen

#endif  // TUTTI_TOOLS_DATAGEN_SYNTH_MEDIA_H_
