#include "common/sample_json.h"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace tutti {
namespace {

// Objects keep their keys in the order of the document (unknown fields are
// named in that order, "meta" passes through as written).
using Json = nlohmann::ordered_json;

// A value as the error names it: its JSON, at most 40 bytes.
std::string Shown(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

absl::Status ReadInputIds(const Json& v, uint64_t limit, SampleJson* out) {
  if (!v.is_array()) {
    return absl::DataLossError(
        "\"input_ids\" is not a list of token ids (pre-tokenise the dataset, e.g. with "
        "tutti convert)");
  }
  if (v.size() > 4000000000u) return absl::DataLossError("\"input_ids\" is too long");
  out->input_ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& e = v[i];
    if (!e.is_number_integer()) {
      return absl::DataLossError(
          absl::StrCat("input_ids[", i, "] is ", Shown(e), ", not an integer token id"));
    }
    const bool negative = e.is_number_integer() && !e.is_number_unsigned() && e.get<int64_t>() < 0;
    if (negative || e.get<uint64_t>() >= limit) {
      const std::string why = absl::StrCat("input_ids[", i, "] is ", Shown(e),
                                           ", outside the vocabulary [0, ", limit, ")");
      return negative ? absl::DataLossError(why) : absl::OutOfRangeError(why);
    }
    out->input_ids.push_back(static_cast<int32_t>(e.get<uint64_t>()));
  }
  out->has_input_ids = true;
  return absl::OkStatus();
}

absl::Status ReadTrained(const Json& v, SampleJson* out) {
  const uint64_t n = out->input_ids.size();
  if (!v.is_array()) {
    return absl::DataLossError("\"trained\" is not a list of [begin, end] token spans");
  }
  uint64_t prev_end = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& s = v[i];
    if (!s.is_array() || s.size() != 2 || !s[0].is_number_unsigned() ||
        !s[1].is_number_unsigned()) {
      return absl::DataLossError(absl::StrCat("trained[", i, "] is ", Shown(s),
                                              ", not a [begin, end] pair of token indices"));
    }
    const uint64_t b = s[0].get<uint64_t>(), e = s[1].get<uint64_t>();
    if (b > e || e > n) {
      return absl::DataLossError(
          absl::StrCat("trained[", i, "] is [", b, ", ", e, "], outside the ", n, " input_ids"));
    }
    if (b < prev_end) {
      return absl::DataLossError(absl::StrCat("trained[", i, "] is [", b, ", ", e,
                                              "], overlapping or before the span ahead of it "
                                              "(spans must be sorted and disjoint)"));
    }
    prev_end = e;
    out->trained.emplace_back(static_cast<uint32_t>(b), static_cast<uint32_t>(e));
  }
  out->has_trained = true;
  return absl::OkStatus();
}

// The reference reader: every document the fast reader below does not take
// whole (any refusal, and the rare forms it leaves alone) is read here, so
// refusals and their messages come from one place.
absl::StatusOr<SampleJson> ParseWithNlohmann(absl::string_view text, const SampleJsonOptions& o) {
  bool too_deep = false;
  const Json::parser_callback_t depth_check = [&](int depth, Json::parse_event_t, Json&) {
    if (depth > o.max_depth) too_deep = true;
    return !too_deep;
  };
  const Json doc = Json::parse(text.begin(), text.end(), depth_check, /*allow_exceptions=*/false);
  if (too_deep) {
    return absl::DataLossError(
        absl::StrCat("invalid JSON: nested deeper than ", o.max_depth, " levels"));
  }
  if (doc.is_discarded()) {
    // Say where it broke: re-parse with a SAX reader that keeps the error.
    struct Where : nlohmann::json_sax<Json> {
      std::string what;
      bool null() override { return true; }
      bool boolean(bool) override { return true; }
      bool number_integer(number_integer_t) override { return true; }
      bool number_unsigned(number_unsigned_t) override { return true; }
      bool number_float(number_float_t, const string_t&) override { return true; }
      bool string(string_t&) override { return true; }
      bool binary(binary_t&) override { return true; }
      bool start_object(std::size_t) override { return true; }
      bool key(string_t&) override { return true; }
      bool end_object() override { return true; }
      bool start_array(std::size_t) override { return true; }
      bool end_array() override { return true; }
      bool parse_error(std::size_t pos, const std::string&,
                       const nlohmann::detail::exception& e) override {
        what = absl::StrCat(e.what(), " (byte ", pos, ")");
        return false;
      }
    } where;
    Json::sax_parse(text.begin(), text.end(), &where, nlohmann::detail::input_format_t::json,
                    /*strict=*/true);
    return absl::DataLossError(absl::StrCat(
        "invalid JSON: ", where.what.empty() ? std::string("unreadable") : where.what));
  }
  if (!doc.is_object()) return absl::DataLossError("not a JSON object");
  SampleJson out;
  const uint64_t limit = o.vocab_size == 0 ? uint64_t{INT32_MAX} + 1 : o.vocab_size;
  if (auto it = doc.find("schema"); it != doc.end()) {
    if (!it->is_number_unsigned() || it->get<uint64_t>() < 1 || it->get<uint64_t>() > 2) {
      return absl::DataLossError(
          absl::StrCat("\"schema\" is ", Shown(*it), "; this reader knows schemas 1 and 2"));
    }
    out.schema = static_cast<int>(it->get<uint64_t>());
  }
  if (auto it = doc.find("input_ids"); it != doc.end()) {
    if (absl::Status s = ReadInputIds(*it, limit, &out); !s.ok()) return s;
  } else if (out.schema == 2) {
    return absl::DataLossError("a schema-2 document has no \"input_ids\"");
  }
  for (const char* key : {"num_tokens", "token_count"}) {
    auto it = doc.find(key);
    if (out.token_count || it == doc.end() || !it->is_number()) continue;
    const double c = it->get<double>();
    if (!it->is_number_unsigned() || c > 4e9) {
      return absl::DataLossError(
          absl::StrCat("\"", key, "\" is ", Shown(*it), ", not a token count"));
    }
    out.token_count = it->get<uint64_t>();
  }
  if (auto it = doc.find("text"); it != doc.end() && it->is_string()) {
    out.text_bytes = it->get_ref<const std::string&>().size();
  }
  if (out.has_input_ids) {
    for (size_t i = 0; i < out.input_ids.size(); ++i) {
      const int64_t id = out.input_ids[i];
      if (id == o.image_placeholder_id) out.image_positions.push_back(static_cast<uint32_t>(i));
      if (id == o.audio_placeholder_id) out.audio_positions.push_back(static_cast<uint32_t>(i));
    }
  }
  for (const auto& [key, value] : doc.items()) {
    if (out.unknown_fields.size() == kMaxUnknownFields) break;
    bool known = false;
    for (const char* k : {"input_ids", "num_tokens", "token_count", "text", "trained", "schema",
                          "source", "meta"}) {
      known |= key == k;
    }
    if (!known) out.unknown_fields.push_back(key.substr(0, 64));
  }
  if (out.schema != 2) return out;
  if (auto it = doc.find("trained"); it != doc.end()) {
    if (absl::Status s = ReadTrained(*it, &out); !s.ok()) return s;
  }
  if (auto it = doc.find("source"); it != doc.end()) {
    if (!it->is_string()) return absl::DataLossError("\"source\" is not a string");
    out.source = it->get<std::string>();
  }
  if (auto it = doc.find("meta"); it != doc.end()) {
    if (!it->is_object()) return absl::DataLossError("\"meta\" is not a JSON object");
    out.meta = it->dump(-1, ' ', false, Json::error_handler_t::replace);
    if (out.meta.size() > o.max_meta_bytes) {
      return absl::DataLossError(absl::StrCat(
          "\"meta\" is ", out.meta.size(), " bytes as JSON, over the limit of ", o.max_meta_bytes));
    }
  }
  return out;
}

// The fast reader, simdjson's DOM: it validates the whole document as strictly
// as the reference reader (UTF-8, escapes, surrogates, control characters,
// numbers, trailing bytes) and reads the fields from its tape. It returns
// nullopt, and the reference reader then decides, for every document it does
// not accept as is: a refusal of any kind, nesting near the depth limit,
// repeated top-level keys (the reference keeps the last value at the first
// place), and a 0 that may have been written "-0" where an unsigned integer is
// required (the reference refuses "-0" there). What it accepts, the reference
// reader accepts with the same result.
class FastReader {
 public:
  FastReader(absl::string_view text, const SampleJsonOptions& o) : text_(text), o_(o) {}

  std::optional<SampleJson> Read() {
    if (o_.max_depth < 2) return std::nullopt;
    // One parser per thread, its buffers reused from document to document.
    thread_local simdjson::dom::parser parser;
    // simdjson's max_depth d reads d - 1 nested arrays and objects, the
    // reference max_depth + 1: the top-level object and max_depth below it.
    const size_t depth = static_cast<size_t>(o_.max_depth) + 1;
    if (parser.max_depth() != depth &&
        parser.allocate(std::max<size_t>(parser.capacity(), text_.size()), depth) !=
            simdjson::SUCCESS) {
      return std::nullopt;
    }
    simdjson::dom::object doc;
    if (parser.parse(text_.data(), text_.size()).get(doc) != simdjson::SUCCESS) {
      return std::nullopt;
    }
    minus_zero_ = text_.find("-0") != absl::string_view::npos;
    SampleJson out;
    // The top-level fields by name, each seen once.
    std::optional<simdjson::dom::element> schema, input_ids, num_tokens, token_count, text, trained,
        source, meta;
    std::vector<std::string_view> keys;
    for (simdjson::dom::key_value_pair field : doc) {
      keys.push_back(field.key);
      std::optional<simdjson::dom::element>* slot = nullptr;
      if (field.key == "schema")
        slot = &schema;
      else if (field.key == "input_ids")
        slot = &input_ids;
      else if (field.key == "num_tokens")
        slot = &num_tokens;
      else if (field.key == "token_count")
        slot = &token_count;
      else if (field.key == "text")
        slot = &text;
      else if (field.key == "trained")
        slot = &trained;
      else if (field.key == "source")
        slot = &source;
      else if (field.key == "meta")
        slot = &meta;
      if (slot != nullptr) {
        *slot = field.value;
      } else if (out.unknown_fields.size() < kMaxUnknownFields) {
        out.unknown_fields.emplace_back(field.key.substr(0, 64));
      }
    }
    if (keys.size() > 1) {
      std::sort(keys.begin(), keys.end());
      if (std::adjacent_find(keys.begin(), keys.end()) != keys.end()) return std::nullopt;
    }
    if (schema) {
      const std::optional<uint64_t> v = Unsigned(*schema);
      if (!v || *v < 1 || *v > 2) return std::nullopt;
      out.schema = static_cast<int>(*v);
    }
    if (input_ids) {
      if (!ReadIds(*input_ids, &out)) return std::nullopt;
    } else if (out.schema == 2) {
      return std::nullopt;
    }
    for (const auto* count : {&num_tokens, &token_count}) {
      if (out.token_count || !*count || !(*count)->is_number()) continue;
      const std::optional<uint64_t> v = Unsigned(**count);
      if (!v || *v > 4000000000u) return std::nullopt;
      out.token_count = *v;
    }
    if (text && text->is_string()) out.text_bytes = text->get_string_length().value_unsafe();
    if (out.schema != 2) return out;
    if (trained && !ReadSpans(*trained, &out)) return std::nullopt;
    if (source) {
      std::string_view s;
      if (source->get_string().get(s) != simdjson::SUCCESS) return std::nullopt;
      out.source = std::string(s);
    }
    if (meta) {
      if (!meta->is_object()) return std::nullopt;
      // The compact form is the reference's (its escapes and number forms):
      // the object, minified with every value as parsed, read back by it.
      const Json m = Json::parse(simdjson::minify(*meta), nullptr, /*allow_exceptions=*/false);
      if (!m.is_object()) return std::nullopt;
      out.meta = m.dump(-1, ' ', false, Json::error_handler_t::replace);
      if (out.meta.size() > o_.max_meta_bytes) return std::nullopt;
    }
    return out;
  }

 private:
  // An integer written without '-', as the reference's unsigned numbers.
  std::optional<uint64_t> Unsigned(simdjson::dom::element v) const {
    if (v.type() == simdjson::dom::element_type::UINT64) return v.get_uint64().value_unsafe();
    if (v.type() != simdjson::dom::element_type::INT64) return std::nullopt;
    const int64_t i = v.get_int64().value_unsafe();
    if (i < 0 || (i == 0 && minus_zero_)) return std::nullopt;
    return static_cast<uint64_t>(i);
  }

  // The hot path: every id an integer in [0, limit), placeholders noted.
  bool ReadIds(simdjson::dom::element v, SampleJson* out) const {
    simdjson::dom::array ids;
    if (v.get_array().get(ids) != simdjson::SUCCESS) return false;
    const size_t n = ids.size();  // saturates at 0xFFFFFF: a lower bound
    if (n > 4000000000u) return false;
    const uint64_t limit = o_.vocab_size == 0 ? uint64_t{INT32_MAX} + 1 : o_.vocab_size;
    out->input_ids.reserve(n);
    for (simdjson::dom::element e : ids) {
      if (e.type() != simdjson::dom::element_type::INT64) return false;
      const int64_t id = e.get_int64().value_unsafe();
      if (id < 0 || static_cast<uint64_t>(id) >= limit) {
        return false;  // a float, a string, a negative or too large id: refused
      }
      if (id == o_.image_placeholder_id) out->image_positions.push_back(out->input_ids.size());
      if (id == o_.audio_placeholder_id) out->audio_positions.push_back(out->input_ids.size());
      out->input_ids.push_back(static_cast<int32_t>(id));
    }
    if (out->input_ids.size() > 4000000000u) return false;
    out->has_input_ids = true;
    return true;
  }

  bool ReadSpans(simdjson::dom::element v, SampleJson* out) const {
    simdjson::dom::array spans;
    if (v.get_array().get(spans) != simdjson::SUCCESS) return false;
    const uint64_t n = out->input_ids.size();
    uint64_t prev_end = 0;
    for (simdjson::dom::element s : spans) {
      simdjson::dom::array pair;
      if (s.get_array().get(pair) != simdjson::SUCCESS) return false;
      std::optional<uint64_t> be[2];
      size_t k = 0;
      for (simdjson::dom::element x : pair) {
        if (k == 2) return false;
        be[k++] = Unsigned(x);
      }
      if (k != 2 || !be[0] || !be[1]) return false;
      const uint64_t b = *be[0], e = *be[1];
      if (b > e || e > n || b < prev_end) return false;
      prev_end = e;
      out->trained.emplace_back(static_cast<uint32_t>(b), static_cast<uint32_t>(e));
    }
    out->has_trained = true;
    return true;
  }

  absl::string_view text_;
  const SampleJsonOptions& o_;
  bool minus_zero_ = false;  // the text holds "-0" somewhere
};

}  // namespace

absl::StatusOr<SampleJson> ParseSampleJson(absl::string_view text, const SampleJsonOptions& o) {
  if (std::optional<SampleJson> fast = FastReader(text, o).Read()) return *std::move(fast);
  return ParseWithNlohmann(text, o);
}

absl::Status CheckPlaceholders(const SampleJson& s, size_t images, size_t audio) {
  if (s.schema != 2) {
    const bool image = !s.image_positions.empty();
    if (!image && s.audio_positions.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "input_ids[", image ? s.image_positions[0] : s.audio_positions[0], "] is the ",
        image ? "image" : "audio",
        " placeholder id, inside the text of a schema-1 document (no "
        "\"schema\": 2); write the sample as schema 2 or tokenise its text without that id"));
  }
  for (const auto& [what, found, members] :
       {std::tuple{"image", s.image_positions.size(), images},
        std::tuple{"audio", s.audio_positions.size(), audio}}) {
    if (found != members) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input_ids hold ", found, " ", what, " placeholders but the sample has ", members, " ",
          what, " members (k.0.", std::string(what) == "image" ? "jpg" : "wav",
          ", ...): one placeholder per ", what, ", in order"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DatasetManifest> ParseDatasetManifest(absl::string_view text) {
  const Json doc = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::DataLossError("is not a JSON object");
  }
  auto format = doc.find("format");
  if (format == doc.end() || *format != "tutti-dataset") {
    return absl::DataLossError("has no \"format\": \"tutti-dataset\"");
  }
  DatasetManifest m;
  auto id = [](const Json& v, const std::string& where, int64_t* out) -> absl::Status {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t{INT32_MAX}) {
      return absl::DataLossError(absl::StrCat(where, " is ", Shown(v), ", not a token id"));
    }
    *out = static_cast<int64_t>(v.get<uint64_t>());
    return absl::OkStatus();
  };
  if (auto it = doc.find("schema"); it != doc.end()) {
    if (!it->is_number_unsigned()) return absl::DataLossError("\"schema\" is not a number");
    m.schema = static_cast<int>(it->get<uint64_t>());
  }
  if (auto t = doc.find("tokenizer"); t != doc.end() && t->is_object()) {
    if (auto v = t->find("vocab_size"); v != t->end()) {
      if (!v->is_number_unsigned()) {
        return absl::DataLossError("\"tokenizer.vocab_size\" is not a number");
      }
      m.vocab_size = v->get<uint64_t>();
    }
  }
  if (auto p = doc.find("placeholders"); p != doc.end()) {
    if (!p->is_object()) return absl::DataLossError("\"placeholders\" is not an object");
    for (const auto& [name, out] : {std::pair{"image", &m.image_placeholder_id},
                                    std::pair{"audio", &m.audio_placeholder_id}}) {
      if (auto v = p->find(name); v != p->end()) {
        if (absl::Status s = id(*v, absl::StrCat("\"placeholders.", name, "\""), out); !s.ok()) {
          return s;
        }
      }
    }
  }
  if (auto k = doc.find("markers"); k != doc.end()) {
    if (!k->is_object()) return absl::DataLossError("\"markers\" is not an object");
    for (const auto& [name, v] : k->items()) {
      int64_t value;
      if (absl::Status s = id(v, absl::StrCat("\"markers.", name, "\""), &value); !s.ok()) {
        return s;
      }
      m.markers[name] = value;
    }
  }
  return m;
}

}  // namespace tutti
