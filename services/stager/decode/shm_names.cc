#include "services/stager/decode/shm_names.h"

#include <unistd.h>

#include <cctype>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_io.h"
#include "common/log.h"
#include "common/shm.h"
#include "common/status.h"

namespace tutti::stager {
namespace {

const Logger kLog("stager.segments");

// A recorded prefix is only acted on when it has the shape this file writes.
bool LooksLikeOurPrefix(const std::string& p) {
  if (!absl::StartsWith(p, "/tutti-") || p.size() < 10 || p.size() > 120) return false;
  for (size_t i = 1; i < p.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(p[i]);
    if (!std::isalnum(c) && c != '-' && c != '_') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<SegmentNames> SegmentNames::Claim(const std::string& cache_dir,
                                                 const std::string& job_id, int* removed) {
  if (removed) *removed = 0;
  const std::string record = absl::StrCat(cache_dir, "/", kRecordFile);
  if (auto old = ReadFileToString(record); old.ok()) {
    const std::string prefix(absl::StripAsciiWhitespace(*old));
    if (LooksLikeOurPrefix(prefix)) {
      // "-n" follows the prefix in every name: no other prefix that merely
      // starts the same way is touched.
      ASSIGN_OR_RETURN(int n, ShmSegment::UnlinkWithPrefix(absl::StrCat(prefix, "-n")));
      if (removed) *removed = n;
      if (n > 0) {
        kLog.Info("removed the batch segments the previous tutti-stagerd of this cache left",
                  {{"segments", n}, {"prefix", absl::StrCat(prefix, "-*")}, {"cache", cache_dir}});
      }
    }
  }
  std::string job = job_id.substr(0, 64);
  for (char& c : job) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  }
  std::random_device rd;
  const std::string prefix =
      absl::StrCat("/tutti-", job, "-", ::getpid(), "-", absl::StrFormat("%08x", rd()));
  // Like the cache's shard files: the daemon's user and group only.
  RETURN_IF_ERROR(Annotate(WriteFileAtomically(record, absl::StrCat(prefix, "\n"), 0640),
                           "cannot record the batch segment names in the cache directory"));
  return SegmentNames(prefix);
}

std::string SegmentNames::Name(uint32_t node, uint32_t rank, uint64_t step) const {
  return absl::StrCat(prefix_, "-n", node, "-r", rank, "-s", step);
}

}  // namespace tutti::stager
