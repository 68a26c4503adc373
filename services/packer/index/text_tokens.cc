#include "services/packer/index/text_tokens.h"

#include <cctype>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tutti::packer {
namespace {

// A small validating JSON reader: enough to find a few top-level fields.
class JsonReader {
 public:
  explicit JsonReader(absl::string_view s) : s_(s) {}

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  void SkipSpace() {
    while (i_ < s_.size() &&
           (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) {
      ++i_;
    }
  }
  bool Peek(char c) {
    SkipSpace();
    return i_ < s_.size() && s_[i_] == c;
  }
  bool Consume(char c) {
    if (!Peek(c)) return Fail(absl::StrCat("expected '", std::string(1, c), "'"));
    ++i_;
    return true;
  }
  bool AtEnd() {
    SkipSpace();
    return i_ == s_.size();
  }

  // Reads a string; *bytes receives its raw content length.
  bool String(std::string* out, uint64_t* bytes) {
    if (!Consume('"')) return false;
    const size_t start = i_;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (static_cast<unsigned char>(s_[i_]) < 0x20) return Fail("control character in string");
      if (s_[i_] == '\\') {
        if (++i_ >= s_.size()) break;
        const char e = s_[i_];
        if (e == 'u') {
          for (int k = 0; k < 4; ++k) {
            if (++i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_]))) {
              return Fail("bad \\u escape");
            }
          }
        } else if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos) {
          return Fail("bad escape");
        }
      }
      ++i_;
    }
    if (i_ >= s_.size()) return Fail("unterminated string");
    if (out != nullptr) out->assign(s_.data() + start, i_ - start);
    if (bytes != nullptr) *bytes = i_ - start;
    ++i_;
    return true;
  }

  bool Number(double* out) {
    SkipSpace();
    const size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    size_t digits = 0;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_, ++digits;
    if (digits == 0) return Fail("bad number");
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    if (out != nullptr)
      *out = std::strtod(std::string(s_.substr(start, i_ - start)).c_str(), nullptr);
    return true;
  }

  bool Literal(absl::string_view word) {
    SkipSpace();
    if (s_.substr(i_, word.size()) != word) return Fail("bad literal");
    i_ += word.size();
    return true;
  }

  // Skips any value.
  bool Skip(int depth = 0) {
    if (depth > 64) return Fail("nested too deeply");
    SkipSpace();
    if (i_ >= s_.size()) return Fail("unexpected end");
    const char c = s_[i_];
    if (c == '"') return String(nullptr, nullptr);
    if (c == '{') {
      ++i_;
      if (Peek('}')) return Consume('}');
      do {
        if (!String(nullptr, nullptr) || !Consume(':') || !Skip(depth + 1)) return false;
      } while (Peek(',') && Consume(','));
      return Consume('}');
    }
    if (c == '[') {
      uint64_t n;
      return Array(depth, &n);
    }
    if (c == 't') return Literal("true");
    if (c == 'f') return Literal("false");
    if (c == 'n') return Literal("null");
    return Number(nullptr);
  }

  // Reads an array, counting its elements.
  bool Array(int depth, uint64_t* count) {
    if (!Consume('[')) return false;
    *count = 0;
    if (Peek(']')) return Consume(']');
    do {
      if (!Skip(depth + 1)) return false;
      ++*count;
    } while (Peek(',') && Consume(','));
    return Consume(']');
  }

  // Reads an array of token ids, each an integer literal in [0, limit).
  // False with *why set (and the JSON still readable) for a bad id, and
  // *beyond for an integer at or above the limit; false with error() set
  // for broken JSON.
  bool TokenIds(uint64_t limit, uint64_t* count, std::string* why, bool* beyond) {
    if (!Consume('[')) return false;
    *count = 0;
    if (Peek(']')) return Consume(']');
    do {
      SkipSpace();
      const size_t start = i_;
      bool negative = false;
      if (i_ < s_.size() && s_[i_] == '-') negative = true, ++i_;
      uint64_t v = 0;
      size_t digits = 0;
      bool overflow = false;
      for (; i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_])); ++i_, ++digits) {
        overflow |= v > (UINT64_MAX - 9) / 10;
        v = v * 10 + static_cast<uint64_t>(s_[i_] - '0');
      }
      const bool integer = digits > 0 && !(i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' ||
                                                              s_[i_] == 'E'));
      if (!integer || negative || overflow || v >= limit) {
        i_ = start;
        if (!Skip(1)) return false;
        const std::string value(s_.substr(start, std::min<size_t>(i_ - start, 40)));
        *beyond = integer && !negative;
        *why = !integer ? absl::StrCat("input_ids[", *count, "] is ", value,
                                       ", not an integer token id")
                        : absl::StrCat("input_ids[", *count, "] is ", value,
                                       ", outside the vocabulary [0, ", limit, ")");
        return false;
      }
      ++*count;
    } while (Peek(',') && Consume(','));
    return Consume(']');
  }

  bool Fail(absl::string_view what) {
    if (error_.empty()) error_ = absl::StrCat(what, " at byte ", i_);
    return false;
  }

 private:
  absl::string_view s_;
  size_t i_ = 0;
  std::string error_;
};

// The fields of a sample's k.json that tutti knows: the token counts read
// here and the rest of the sample schema (trained spans, schema version,
// source, meta) that tutti convert writes.
bool IsSampleField(absl::string_view key) {
  for (absl::string_view known :
       {"input_ids", "num_tokens", "token_count", "text", "trained", "schema", "source", "meta"}) {
    if (key == known) return true;
  }
  return false;
}

}  // namespace

uint32_t EstimateTextTokens(uint64_t bytes, double bytes_per_token) {
  if (bytes_per_token <= 0) bytes_per_token = kDefaultBytesPerToken;
  const double t = std::ceil(static_cast<double>(bytes) / bytes_per_token);
  return t > 4e9 ? 4000000000u : static_cast<uint32_t>(t);
}

absl::StatusOr<uint32_t> JsonTokenCount(absl::string_view json, double bytes_per_token,
                                        uint64_t vocab_size,
                                        std::vector<std::string>* unknown_fields) {
  const uint64_t limit = vocab_size == 0 ? uint64_t{INT32_MAX} + 1 : vocab_size;
  JsonReader r(json);
  if (!r.Consume('{')) return absl::DataLossError("not a JSON object");
  bool have_ids = false, have_count = false, have_text = false;
  uint64_t ids = 0, text_bytes = 0;
  double count = 0;
  if (!r.Peek('}')) {
    do {
      std::string key;
      if (!r.String(&key, nullptr) || !r.Consume(':')) break;
      if (key == "input_ids") {
        if (!r.Peek('[')) {
          return absl::DataLossError(
              "\"input_ids\" is not a list of token ids (pre-tokenise the dataset)");
        }
        std::string why;
        bool beyond = false;
        if (!r.TokenIds(limit, &ids, &why, &beyond)) {
          if (!why.empty()) return beyond ? absl::OutOfRangeError(why) : absl::DataLossError(why);
          break;
        }
        have_ids = true;
      } else if ((key == "num_tokens" || key == "token_count") && !have_count && !r.Peek('"') &&
                 !r.Peek('{') && !r.Peek('[')) {
        if (!r.Number(&count)) break;
        if (count < 0 || count != std::floor(count) || count > 4e9) {
          return absl::DataLossError(absl::StrCat("\"", key, "\" is not a token count"));
        }
        have_count = true;
      } else if (key == "text" && r.Peek('"')) {
        if (!r.String(nullptr, &text_bytes)) break;
        have_text = true;
      } else {
        if (unknown_fields != nullptr && !IsSampleField(key) && unknown_fields->size() < 16) {
          unknown_fields->push_back(key.substr(0, 64));
        }
        if (!r.Skip()) break;
      }
    } while (r.Peek(',') && r.Consume(','));
  }
  if (r.ok()) r.Consume('}');
  if (r.ok() && !r.AtEnd()) r.Fail("trailing data");
  if (!r.ok()) return absl::DataLossError(absl::StrCat("invalid JSON: ", r.error()));
  if (have_ids) {
    if (ids > 4000000000u) return absl::DataLossError("input_ids is too long");
    return static_cast<uint32_t>(ids);
  }
  if (have_count) return static_cast<uint32_t>(count);
  if (have_text) return EstimateTextTokens(text_bytes, bytes_per_token);
  return absl::NotFoundError(
      "JSON has no input_ids, num_tokens, token_count or text field to count tokens from");
}

}  // namespace tutti::packer
