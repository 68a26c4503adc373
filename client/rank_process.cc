#include "client/rank_process.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "common/grpc_status.h"
#include "common/security_options.h"

namespace tutti {

absl::Status RankProcess::Register() {
  absl::MutexLock l(&mu_);
  return RegisterLocked();
}

absl::Status RankProcess::RegisterAgain(uint64_t stale) {
  absl::MutexLock l(&mu_);
  if (id_.incarnation != stale) return absl::OkStatus();  // another thread did
  return RegisterLocked();
}

absl::Status RankProcess::RegisterLocked() {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  v1::RegisterRankRequest req;
  req.set_rank(rank_);
  v1::RegisterRankResponse resp;
  const absl::Status s = FromGrpcStatus(stub_->RegisterRank(&ctx, req, &resp));
  if (!s.ok()) return s;
  id_ = Id{resp.incarnation(), resp.key()};
  return absl::OkStatus();
}

RankProcess::Id RankProcess::Current() const {
  absl::MutexLock l(&mu_);
  return id_;
}

bool RankProcess::Unknown(const absl::Status& status) {
  return absl::IsNotFound(status) && absl::StrContains(status.message(), kUnknownIncarnation);
}

}  // namespace tutti
