#include "common/grpc_refusal.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tutti {
namespace {

// RFC 9113: the client's connection preface, frame types and flags.
constexpr absl::string_view kPreface("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);
constexpr uint8_t kHeaders = 0x1, kSettings = 0x4, kGoaway = 0x7;
constexpr uint8_t kAck = 0x1, kEndStream = 0x1, kEndHeaders = 0x4;
constexpr size_t kFrameHeader = 9;
// A client about to be refused sends its preface, settings and a call's
// headers: a few hundred bytes.
constexpr uint64_t kMaxReceived = 64 << 10;

void AppendBigEndian32(uint32_t v, std::string* out) {
  for (int shift : {24, 16, 8, 0}) out->push_back(static_cast<char>((v >> shift) & 0xff));
}

std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, absl::string_view payload) {
  std::string f;
  const size_t n = payload.size();
  for (int shift : {16, 8, 0}) f.push_back(static_cast<char>((n >> shift) & 0xff));
  f.push_back(static_cast<char>(type));
  f.push_back(static_cast<char>(flags));
  AppendBigEndian32(stream & 0x7fffffff, &f);
  f.append(payload.data(), payload.size());
  return f;
}

// RFC 7541 5.1: an integer with a `prefix_bits` prefix under the bits `high`.
void HpackInteger(uint8_t high, int prefix_bits, uint64_t v, std::string* out) {
  const uint64_t max = (uint64_t{1} << prefix_bits) - 1;
  if (v < max) {
    out->push_back(static_cast<char>(high | v));
    return;
  }
  out->push_back(static_cast<char>(high | max));
  for (v -= max; v >= 128; v >>= 7) out->push_back(static_cast<char>(0x80 | (v & 0x7f)));
  out->push_back(static_cast<char>(v));
}

// RFC 7541 5.2: a string literal, not Huffman-coded.
void HpackString(absl::string_view s, std::string* out) {
  HpackInteger(0, 7, s.size(), out);
  out->append(s.data(), s.size());
}

// grpc-message's encoding: printable ASCII but '%' as is, the rest %XX.
std::string PercentEncode(absl::string_view s) {
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c <= 0x7e && c != '%') {
      out.push_back(ch);
    } else {
      absl::StrAppend(&out, absl::StrFormat("%%%02X", c));
    }
  }
  return out;
}

}  // namespace

GrpcRefusal::GrpcRefusal(const absl::Status& status)
    : code_(absl::StrCat(static_cast<int>(status.code()))),
      message_(PercentEncode(status.message())) {}

std::string GrpcRefusal::Greeting() const { return Frame(kSettings, 0, 0, ""); }

std::string GrpcRefusal::Answer(uint32_t stream) const {
  // Trailers-only: one HEADERS frame that ends the stream. Literals are
  // "without indexing" (RFC 7541 6.2.2), so the client's decoder table is
  // left as it was.
  std::string block;
  block.push_back(static_cast<char>(0x88));  // :status: 200, static table entry 8
  HpackInteger(0x00, 4, 31, &block);         // content-type, static table entry 31
  HpackString("application/grpc", &block);
  for (const auto& [name, value] :
       {std::pair<absl::string_view, absl::string_view>("grpc-status", code_),
        {"grpc-message", message_}}) {
    block.push_back(0x00);  // a new name
    HpackString(name, &block);
    HpackString(value, &block);
  }
  return Frame(kHeaders, kEndStream | kEndHeaders, stream, block);
}

std::string GrpcRefusal::Feed(absl::string_view bytes) {
  if (finished_ || failed_) return "";
  received_ += bytes.size();
  if (received_ > kMaxReceived) {
    failed_ = true;
    return "";
  }
  pending_.append(bytes.data(), bytes.size());
  if (!preface_seen_) {
    const size_t n = std::min(pending_.size(), kPreface.size());
    if (absl::string_view(pending_).substr(0, n) != kPreface.substr(0, n)) {
      failed_ = true;
      return "";
    }
    if (pending_.size() < kPreface.size()) return "";
    pending_.erase(0, kPreface.size());
    preface_seen_ = true;
  }
  std::string reply;
  uint32_t last_stream = 0;
  size_t at = 0;
  while (pending_.size() - at >= kFrameHeader) {
    const auto* h = reinterpret_cast<const unsigned char*>(pending_.data() + at);
    const size_t length = (size_t{h[0]} << 16) | (size_t{h[1]} << 8) | h[2];
    const uint8_t type = h[3], flags = h[4];
    const uint32_t stream =
        ((uint32_t{h[5]} << 24) | (uint32_t{h[6]} << 16) | (uint32_t{h[7]} << 8) | h[8]) &
        0x7fffffff;
    if (pending_.size() - at - kFrameHeader < length) break;  // the rest comes later
    if (type == kSettings && (flags & kAck) == 0) reply += Frame(kSettings, kAck, 0, "");
    if (type == kHeaders && stream > last_stream) {
      reply += Answer(stream);
      last_stream = stream;
    }
    at += kFrameHeader + length;
  }
  pending_.erase(0, at);
  if (last_stream != 0) {
    std::string goaway;  // the last stream answered, NO_ERROR
    AppendBigEndian32(last_stream, &goaway);
    AppendBigEndian32(0, &goaway);
    reply += Frame(kGoaway, 0, 0, goaway);
    finished_ = true;
  }
  return reply;
}

}  // namespace tutti
