// The members a batch reads besides images: a sample's text (k.json, read by
// common/sample_json.h as the index reads it) and audio clips (WAV, parsed by
// common/media_header.h as the index parses it).
//
// Pure logic: no I/O.
#ifndef TUTTI_SERVICES_STAGER_DECODE_MEMBERS_H_
#define TUTTI_SERVICES_STAGER_DECODE_MEMBERS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/sample_json.h"
#include "tutti/v1/job.pb.h"

namespace tutti::stager {

// input_ids from a WebDataset k.json ({"input_ids": [1, 2, ...], ...}), read
// by common/sample_json.h as the index reads it (the top-level field only).
// NOT_FOUND when it has none, DATA_LOSS when malformed.
absl::StatusOr<std::vector<int32_t>> ParseInputIds(absl::string_view json);

// A k.json as the stager serves it: ParseInputIds' checks and messages, the
// whole document (schema 2: the placeholders are the config's image_pad_id
// and audio_pad_id, as tutti convert writes them).
absl::StatusOr<SampleJson> ParseTextMember(absl::string_view json, const v1::JobConfig& config);

// Truncates or repeats `tokens` to exactly n (n > 0 and tokens empty: zeros).
std::vector<int32_t> FitTokens(const std::vector<int32_t>& tokens, size_t n);

// Decodes a WAV clip to mono float32 at `rate`, fitted to `samples`.
absl::StatusOr<std::vector<float>> DecodeWav(absl::string_view bytes, uint32_t rate,
                                             uint64_t samples);

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_DECODE_MEMBERS_H_
