#include "services/stager/decode/skip.h"

#include "absl/strings/cord.h"

namespace tutti::stager {
namespace {
constexpr absl::string_view kTruncatedUrl = "type.tutti.dev/skip/truncated";
constexpr absl::string_view kChecksumUrl = "type.tutti.dev/skip/checksum";
constexpr absl::string_view kOutsideRootUrl = "type.tutti.dev/skip/outside_root";
}  // namespace

absl::Status TruncatedError(absl::string_view message) {
  absl::Status s = absl::DataLossError(message);
  s.SetPayload(kTruncatedUrl, absl::Cord("1"));
  return s;
}

absl::Status ChecksumError(absl::string_view message) {
  absl::Status s = absl::DataLossError(message);
  s.SetPayload(kChecksumUrl, absl::Cord("1"));
  return s;
}

absl::Status OutsideRootError(absl::string_view message) {
  absl::Status s = absl::PermissionDeniedError(message);
  s.SetPayload(kOutsideRootUrl, absl::Cord("1"));
  return s;
}

const char* SkipReason(const absl::Status& s) {
  if (s.GetPayload(kOutsideRootUrl).has_value()) return "outside_root";
  if (s.GetPayload(kTruncatedUrl).has_value()) return "truncated";
  if (s.GetPayload(kChecksumUrl).has_value()) return "checksum";
  switch (s.code()) {
    case absl::StatusCode::kDeadlineExceeded: return "deadline";
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kResourceExhausted: return "too_large";
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied: return "missing";
    default: return "corrupt";
  }
}

}  // namespace tutti::stager
