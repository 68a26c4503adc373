#include "common/rank_identity.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tutti {

void RankIdentities::SetJob(std::string job_id) {
  absl::MutexLock l(&mu_);
  known_ = true;
  job_id_ = std::move(job_id);
}

absl::Status RankIdentities::Admit(const ClientIdentity& caller, uint32_t rank) const {
  absl::MutexLock l(&mu_);
  if (!known_) {
    return absl::UnavailableError("the daemon does not know its job yet; retry");
  }
  if (!caller.job_id.empty() && caller.job_id != job_id_) {
    return absl::PermissionDeniedError(absl::StrCat("rank ", rank, ": this client belongs to job '",
                                                    caller.job_id, "' but this daemon serves job '",
                                                    job_id_, "'"));
  }
  if (caller.rank < 0) {
    if (!require_) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat("rank ", rank, ": the call says no rank it acts as (", kRankKey,
                     " metadata); ranks connect through libtutti (tutti::Client), which sends it"));
  }
  if (static_cast<uint64_t>(caller.rank) != rank) {
    return absl::PermissionDeniedError(
        absl::StrCat("rank ", rank, ": this client is rank ", caller.rank,
                     " and may act only as itself, not as rank ", rank));
  }
  return absl::OkStatus();
}

}  // namespace tutti
