#include "services/stager/decode/members.h"

#include <cmath>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/media_header.h"
#include "common/status.h"

namespace tutti::stager {

absl::StatusOr<SampleJson> ParseTextMember(absl::string_view json,
                                           const SampleJsonOptions& options) {
  auto doc = ParseSampleJson(json, options);
  if (!doc.ok()) {
    const size_t first = json.find_first_not_of(" \t\r\n");
    if (first == absl::string_view::npos || json[first] != '{') {
      return absl::DataLossError(absl::StrCat(
          "is not a JSON object (", json.size(), " bytes starting with '",
          absl::CHexEscape(json.substr(first == absl::string_view::npos ? 0 : first, 8)),
          "'); the member changed after indexing, re-index the dataset"));
    }
    return doc.status();
  }
  if (!doc->has_input_ids) {
    return absl::NotFoundError("has no \"input_ids\" (pre-tokenise the dataset)");
  }
  return doc;
}

absl::StatusOr<SampleJson> ParseTextMember(absl::string_view json, const v1::JobConfig& config) {
  SampleJsonOptions o;
  o.image_placeholder_id = config.vision().image_pad_id();
  o.audio_placeholder_id = config.audio().audio_pad_id();
  return ParseTextMember(json, o);
}

absl::StatusOr<std::vector<int32_t>> ParseInputIds(absl::string_view json) {
  auto doc = ParseTextMember(json, SampleJsonOptions{});
  if (!doc.ok()) return doc.status();
  return std::move(doc->input_ids);
}

std::vector<int32_t> FitTokens(const std::vector<int32_t>& tokens, size_t n) {
  std::vector<int32_t> out(n, 0);
  if (tokens.empty()) return out;
  for (size_t i = 0; i < n; ++i) out[i] = tokens[i % tokens.size()];
  return out;
}

absl::StatusOr<std::vector<float>> DecodeWav(absl::string_view b, uint32_t rate, uint64_t samples) {
  // The index's parser (common/media_header.h): what it accepted is what decodes here.
  ASSIGN_OR_RETURN(const AudioHeader h, ReadWavHeader(b));
  const uint32_t format = h.format, channels = h.channels, src_rate = h.sample_rate,
                 bits = h.bits_per_sample, bytes = bits / 8;
  const absl::string_view data = b.substr(h.data_offset, h.data_size);
  const size_t frames = data.size() / (bytes * channels);
  std::vector<float> mono(frames, 0.0f);
  for (size_t f = 0; f < frames; ++f) {
    double sum = 0;  // channels near the float limit still average to a float
    for (uint32_t c = 0; c < channels; ++c) {
      const char* p = data.data() + (f * channels + c) * bytes;
      float v;
      if (format == 3) {
        std::memcpy(&v, p, 4);
      } else if (bits == 8) {
        v = (uint8_t(p[0]) - 128) / 128.0f;
      } else if (bits == 16) {
        v = int16_t(uint16_t(uint8_t(p[0]) | (uint8_t(p[1]) << 8))) / 32768.0f;
      } else if (bits == 24) {
        int32_t x = int32_t(uint32_t(uint8_t(p[0])) << 8 | uint32_t(uint8_t(p[1])) << 16 |
                            uint32_t(uint8_t(p[2])) << 24);
        v = (x >> 8) / 8388608.0f;
      } else {
        int32_t x;
        std::memcpy(&x, p, 4);
        v = x / 2147483648.0f;
      }
      if (!std::isfinite(v)) {
        return absl::DataLossError(absl::StrCat("WAV sample ", f, " of channel ", c,
                                                " is not a finite number (corrupt float data)"));
      }
      sum += v;
    }
    mono[f] = static_cast<float>(sum / channels);
  }
  std::vector<float> out(samples, 0.0f);
  const double step = static_cast<double>(src_rate) / rate;
  for (uint64_t i = 0; i < samples; ++i) {
    const double x = i * step;
    const size_t k = static_cast<size_t>(x);
    if (k + 1 >= frames) {
      if (k < frames) out[i] = mono[k];
      continue;
    }
    const float w = static_cast<float>(x - k);
    out[i] = mono[k] * (1 - w) + mono[k + 1] * w;
  }
  return out;
}

}  // namespace tutti::stager
