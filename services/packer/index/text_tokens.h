// Text token counts of WebDataset text members, without a tokenizer.
//
//   k.json: (read by common/sample_json.h, the reader the stager serves
//           from) the length of its top-level "input_ids" array less its
//           image/audio placeholders (pre-tokenised, every element checked
//           to be a token id), or
//           else its integer "num_tokens" or "token_count" field, or else an
//           estimate from the byte length of its "text" string.
//   k.txt:  an estimate from the byte length: ceil(bytes / bytes_per_token).
//           The default 4 bytes per token is the usual figure for English
//           with BPE tokenizers (GPT-2/Llama/Qwen vocabularies); set it for
//           other languages. The estimate only sizes packing; a stager that
//           tokenises the text later may see a slightly different count.
#ifndef TUTTI_SERVICES_PACKER_INDEX_TEXT_TOKENS_H_
#define TUTTI_SERVICES_PACKER_INDEX_TEXT_TOKENS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/sample_json.h"

namespace tutti::packer {

inline constexpr double kDefaultBytesPerToken = 4.0;

uint32_t EstimateTextTokens(uint64_t bytes, double bytes_per_token);

// The text tokens of a parsed k.json; NOT_FOUND when it has no field above.
absl::StatusOr<uint32_t> TokenCount(const SampleJson& sample, double bytes_per_token);

// Parses a JSON document (the whole k.json member). DATA_LOSS when it is not
// valid JSON or not an object, or when "input_ids" is not a list of
// non-negative integers, naming the first bad element; OUT_OF_RANGE naming
// it when one is at or above vocab_size (0: 2^31, what an int32 batch
// holds); NOT_FOUND when it has none of the fields above. `unknown_fields`
// (may be null) receives the top-level fields that are neither those above
// nor the rest of tutti's sample schema ("trained", "schema", "source",
// "meta"), at most 16, each cut to 64 bytes: what tutti does not know.
absl::StatusOr<uint32_t> JsonTokenCount(absl::string_view json, double bytes_per_token,
                                        uint64_t vocab_size = 0,
                                        std::vector<std::string>* unknown_fields = nullptr);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_INDEX_TEXT_TOKENS_H_
