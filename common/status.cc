#include "common/status.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tutti {

absl::Status ErrnoStatus(int err, absl::string_view what) {
  std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(msg);
    case EEXIST:
      return absl::AlreadyExistsError(msg);
    case EINVAL:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(msg);
    case EAGAIN:
    case EINTR:
    case EBUSY:
      return absl::UnavailableError(msg);
    case ETIMEDOUT:
      return absl::DeadlineExceededError(msg);
    case EIO:
      return absl::DataLossError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

}  // namespace tutti
