// A file the stager would not open because its name leads outside --source
// or the cache (a symlink out of it, a ".." above it, an absolute name):
// counted, logged (rate-limited) and turned into the error that fails the
// shard's staging or skips the sample with reason "outside_root".
#ifndef TUTTI_SERVICES_STAGER_STAGING_PATH_REFUSAL_H_
#define TUTTI_SERVICES_STAGER_STAGING_PATH_REFUSAL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/root_dir.h"
#include "services/stager/metrics.h"

namespace tutti::stager {

// The label values of tutti_stager_path_refusals_total{root,reason}:
// root "source" or "cache"; reason "outside" (the name resolves outside the
// root), "loop" (a symlink loop, or a symlink where the stager creates a
// file) or "name" (absolute, a ".." component, a NUL byte: refused before
// any lookup).
inline constexpr const char* kPathRoots[] = {"source", "cache"};
inline constexpr const char* kPathRefusalReasons[] = {"outside", "loop", "name"};

// True for the results of an open beneath a root that are refusals: -EXDEV
// (outside) and -ELOOP.
bool IsPathRefusal(int64_t result);

// Counts and logs a refusal and returns its error: PERMISSION_DENIED marked
// "outside_root" (skip.h), naming `what` (e.g. "shard x.tar"), the name and
// the root. `result`: the open's -errno, or 0 for a name refused before any
// lookup (with `why`, the name check's message). metrics may be null.
absl::Status RefusePath(StagerMetrics* metrics, const char* root_label, const RootDir& root,
                        absl::string_view what, absl::string_view name, int64_t result,
                        absl::string_view why = "");

// A file named as a shard that is no regular file (a FIFO, socket or
// device: IoService answered kNotRegularFile, without blocking on it):
// NOT_FOUND (skip reason "missing") naming `what` and `path`.
absl::Status NotRegularFileError(absl::string_view what, absl::string_view path);

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_STAGING_PATH_REFUSAL_H_
