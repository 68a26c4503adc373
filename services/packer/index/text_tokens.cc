#include "services/packer/index/text_tokens.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace tutti::packer {

uint32_t EstimateTextTokens(uint64_t bytes, double bytes_per_token) {
  if (bytes_per_token <= 0) bytes_per_token = kDefaultBytesPerToken;
  const double t = std::ceil(static_cast<double>(bytes) / bytes_per_token);
  return t > 4e9 ? 4000000000u : static_cast<uint32_t>(t);
}

absl::StatusOr<uint32_t> TokenCount(const SampleJson& s, double bytes_per_token) {
  if (s.has_input_ids) return static_cast<uint32_t>(s.text_tokens());
  if (s.token_count) return static_cast<uint32_t>(*s.token_count);
  if (s.text_bytes) return EstimateTextTokens(*s.text_bytes, bytes_per_token);
  return absl::NotFoundError(
      "JSON has no input_ids, num_tokens, token_count or text field to count tokens from");
}

absl::StatusOr<uint32_t> JsonTokenCount(absl::string_view json, double bytes_per_token,
                                        uint64_t vocab_size,
                                        std::vector<std::string>* unknown_fields) {
  SampleJsonOptions o;
  o.vocab_size = vocab_size;
  auto s = ParseSampleJson(json, o);
  if (!s.ok()) return s.status();
  if (unknown_fields != nullptr) *unknown_fields = std::move(s->unknown_fields);
  return TokenCount(*s, bytes_per_token);
}

}  // namespace tutti::packer
