// Error helpers shared by every module: absl::Status everywhere, no exceptions
// across module boundaries. Debian's abseil (20220623) has no status macros.
#ifndef TUTTI_COMMON_STATUS_H_
#define TUTTI_COMMON_STATUS_H_

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TUTTI_CONCAT_INNER_(a, b) a##b
#define TUTTI_CONCAT_(a, b) TUTTI_CONCAT_INNER_(a, b)

// Returns from the current function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                                   \
  do {                                                          \
    ::absl::Status tutti_status_ = (expr);                      \
    if (!tutti_status_.ok()) return tutti_status_;              \
  } while (0)

// ASSIGN_OR_RETURN(auto x, MakeX()); declares/assigns `lhs` from a StatusOr.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(TUTTI_CONCAT_(tutti_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

namespace tutti {

// A Status for a failed system call: "<what>: <strerror(err)>", with a code
// chosen from errno (ENOENT -> NOT_FOUND, ENOSPC -> RESOURCE_EXHAUSTED, ...).
absl::Status ErrnoStatus(int err, absl::string_view what);

// Prefixes a non-OK status's message with context, keeping its code.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace tutti

#endif  // TUTTI_COMMON_STATUS_H_
