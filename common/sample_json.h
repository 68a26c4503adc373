// The one reader of a WebDataset sample's text member k.json, shared by the
// index (token counts, checks) and the stager (the ids it serves), so both
// see the same fields of the same document.
//
// Schema 1 (no "schema" field, or "schema": 1): a top-level "input_ids"
// list of token ids, or else an integer "num_tokens"/"token_count", or else
// a "text" string whose length estimates the tokens. Other fields are the
// user's and are ignored.
//
// Schema 2 ("schema": 2, interleaved multi-turn samples):
//   "input_ids": ids with ONE placeholder id at each image's (and audio
//                clip's) place, in order of appearance (required);
//   "trained":   half-open [begin, end) spans over input_ids indices whose
//                tokens are trained; sorted, disjoint, within [0, len).
//                Absent: every text token is trained;
//   "source":    a string, passed to the trainer;
//   "meta":      an object, passed to the trainer verbatim (bounded size).
// Top-level fields neither schema knows ("input_ids", "num_tokens",
// "token_count", "text", "trained", "schema", "source", "meta") are listed,
// not refused: at most 16, in the document's order, each cut to 64 bytes.
//
// Parsed with simdjson (Debian's libsimdjson-dev); a document it does not
// accept as is (every refusal) is read again with nlohmann-json
// (nlohmann-json3-dev), whose words the refusal messages are. Never throws.
#ifndef TUTTI_COMMON_SAMPLE_JSON_H_
#define TUTTI_COMMON_SAMPLE_JSON_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tutti {

struct SampleJsonOptions {
  // Token ids must lie in [0, vocab_size). Default 0: [0, 2^31), what an
  // int32 batch holds.
  uint64_t vocab_size = 0;
  // The placeholder ids of a schema-2 document; -1 (default): none known,
  // no placeholder is looked for. A schema-1 document holding one of them is
  // refused (a placeholder inside ordinary text).
  int64_t image_placeholder_id = -1;
  int64_t audio_placeholder_id = -1;
  // Largest "meta" object, as compact JSON. Default 64 KiB.
  size_t max_meta_bytes = 64 << 10;
  // Deepest nesting of arrays and objects. Default 64.
  int max_depth = 64;
};

inline constexpr size_t kMaxUnknownFields = 16;

struct SampleJson {
  int schema = 1;
  bool has_input_ids = false;
  std::vector<int32_t> input_ids;
  // Schema 1 without input_ids: the fields a token count comes from.
  std::optional<uint64_t> token_count;  // "num_tokens" or "token_count"
  std::optional<uint64_t> text_bytes;   // bytes of the "text" string
  // Schema 2.
  bool has_trained = false;
  std::vector<std::pair<uint32_t, uint32_t>> trained;  // [begin, end) over input_ids
  std::vector<uint32_t> image_positions;               // input_ids indices of image placeholders
  std::vector<uint32_t> audio_positions;               // and of audio placeholders
  std::string source;
  std::string meta;                         // compact JSON of "meta", empty when absent
  std::vector<std::string> unknown_fields;  // see above

  // input_ids less the placeholders: the text tokens.
  uint64_t text_tokens() const {
    return input_ids.size() - image_positions.size() - audio_positions.size();
  }
};

// Parses a whole k.json member. DATA_LOSS naming the field when it is not a
// JSON object, or a field above has the wrong type or a bad value (the first
// bad input_ids element named by its index); OUT_OF_RANGE naming it when an
// id is an integer at or above the vocabulary; never NOT_FOUND: a document
// without any token field parses, with has_input_ids false and no count.
absl::StatusOr<SampleJson> ParseSampleJson(absl::string_view json,
                                           const SampleJsonOptions& options = {});

// A parsed document against its sample's members: a schema-2 document must
// hold one placeholder per image and per audio clip; a schema-1 document
// none (a placeholder id inside ordinary text would be served as an image
// token with no image). INVALID_ARGUMENT saying which count differs.
absl::Status CheckPlaceholders(const SampleJson& sample, size_t images, size_t audio);

// The dataset manifest, tutti_dataset.json at a dataset's root (written by
// `tutti convert`): what reading its samples needs.
inline constexpr char kDatasetManifestName[] = "tutti_dataset.json";
struct DatasetManifest {
  int schema = 0;
  uint64_t vocab_size = 0;            // tokenizer.vocab_size; 0: not recorded
  int64_t image_placeholder_id = -1;  // placeholders.image; -1: not recorded
  int64_t audio_placeholder_id = -1;  // placeholders.audio
  // markers.{vision_start, image_pad, vision_end, audio_start, audio_pad,
  // audio_end}, those recorded.
  std::map<std::string, int64_t> markers;
};
// DATA_LOSS naming the field when it is not such a manifest ("format":
// "tutti-dataset", ids non-negative integers).
absl::StatusOr<DatasetManifest> ParseDatasetManifest(absl::string_view json);

}  // namespace tutti

#endif  // TUTTI_COMMON_SAMPLE_JSON_H_
