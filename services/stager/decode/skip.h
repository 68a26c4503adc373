// Why a sample member was skipped, as reported in SkippedSample.reason and
// the tutti_stager_skipped_samples_total{reason} counter.
#ifndef TUTTI_SERVICES_STAGER_DECODE_SKIP_H_
#define TUTTI_SERVICES_STAGER_DECODE_SKIP_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tutti::stager {

// Every reason, in the order the counters are created.
inline constexpr const char* kSkipReasons[] = {"corrupt",   "truncated", "checksum",    "deadline",
                                               "too_large", "missing",   "outside_root"};

// DATA_LOSS marked as a cut-off file or shard (reason "truncated").
absl::Status TruncatedError(absl::string_view message);

// DATA_LOSS marked as bytes that do not match the index's checksum (reason
// "checksum"): never decoded into a batch.
absl::Status ChecksumError(absl::string_view message);

// PERMISSION_DENIED marked as a file whose name leads outside --source or the
// cache (reason "outside_root"): never opened.
absl::Status OutsideRootError(absl::string_view message);

// "truncated" for TruncatedError, "checksum" for ChecksumError, "outside_root" for
// OutsideRootError, "deadline" for DEADLINE_EXCEEDED,
// "too_large" for OUT_OF_RANGE / RESOURCE_EXHAUSTED, "missing" for NOT_FOUND /
// PERMISSION_DENIED, "corrupt" otherwise.
const char* SkipReason(const absl::Status& s);

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_DECODE_SKIP_H_
