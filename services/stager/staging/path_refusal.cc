#include "services/stager/staging/path_refusal.h"

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "services/stager/decode/skip.h"

namespace tutti::stager {
namespace {
const Logger kLog("stager.paths");
}  // namespace

bool IsPathRefusal(int64_t result) { return result == -EXDEV || result == -ELOOP; }

absl::Status RefusePath(StagerMetrics* metrics, const char* root_label, const RootDir& root,
                        absl::string_view what, absl::string_view name, int64_t result,
                        absl::string_view why) {
  const char* reason = result == 0 ? "name" : result == -ELOOP ? "loop" : "outside";
  std::string message;
  if (result == 0) {
    message = absl::StrCat(what, ": ", why, "; refused, nothing is opened");
  } else if (result == -ELOOP) {
    message = absl::StrCat(what, " '", name, "' beneath ", root.path(),
                           " is a symlink loop or a symlink where a file is created: refused");
  } else {
    message = std::string(root.OutsideError(what, name).message());
  }
  if (metrics != nullptr) metrics->PathRefused(root_label, reason).Increment();
  static LogRateLimit limit(absl::Seconds(10), 10);
  if (uint64_t suppressed = 0; limit.Allow(&suppressed)) {
    kLog.Warning("refused to open a file outside its directory",
                 {{"root", absl::StrCat("--", root_label, " ", root.path())},
                  {"name", name},
                  {"reason", reason},
                  {"detail", message},
                  {"suppressed", suppressed}});
  }
  return OutsideRootError(message);
}

absl::Status NotRegularFileError(absl::string_view what, absl::string_view path) {
  return absl::NotFoundError(absl::StrCat(
      what, " (", path,
      ") is not a regular file (a FIFO, socket or device): refused without reading it; put the "
      "shard file there or re-index"));
}

}  // namespace tutti::stager
