#include "client/transport.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "tutti/v1/plan.pb.h"

namespace tutti {

absl::Status Transport::Exchange(const v1::RankPlan& plan, const void* send, size_t send_bytes,
                                 void* recv, size_t recv_bytes, const ExchangeContext& ctx) {
  return Run(ExchangeDirection::kForward, plan, send, send_bytes, recv, recv_bytes, ctx);
}

absl::Status Transport::ExchangeBackward(const v1::RankPlan& plan, const void* send,
                                         size_t send_bytes, void* recv, size_t recv_bytes,
                                         const ExchangeContext& ctx) {
  return Run(ExchangeDirection::kBackward, plan, send, send_bytes, recv, recv_bytes, ctx);
}

absl::Status Transport::ExchangeLoad(const v1::RankPlan& plan, const void* send, size_t send_bytes,
                                     void* recv, size_t recv_bytes, const ExchangeContext& ctx) {
  return Run(ExchangeDirection::kLoad, plan, send, send_bytes, recv, recv_bytes, ctx);
}

absl::Status Transport::Agree(const ExchangeLayout& layout, const absl::Status& local) {
  return local;
}

absl::Status Transport::Run(ExchangeDirection dir, const v1::RankPlan& plan, const void* send,
                            size_t send_bytes, void* recv, size_t recv_bytes,
                            const ExchangeContext& ctx) {
  absl::MutexLock lock(&run_mu_);
  absl::StatusOr<ExchangeLayout> layout = BuildExchangeLayout(plan, dir, rank(), world_size(), ctx);
  absl::Status local = ctx.refusal.ok() ? layout.status() : ctx.refusal;
  if (local.ok()) local = CheckBufferSizes(*layout, send_bytes, recv_bytes);
  if (local.ok() && ((send == nullptr && send_bytes > 0) || (recv == nullptr && recv_bytes > 0))) {
    local = absl::InvalidArgumentError(
        absl::StrCat(ExchangeWhere(ctx.step, rank()), ": a null buffer with a non-zero size"));
  }
  ExchangeLayout empty;
  if (!layout.ok()) {
    empty = EmptyLayout(dir, rank(), world_size(), ctx.step);
    empty.encoder = ctx.encoder;  // what the other ranks compare
  }
  const ExchangeLayout& agreed = layout.ok() ? *layout : empty;
  ExchangeData data;
  data.send = send;
  data.recv = recv;
  data.scratch_recv = ctx.scratch_recv;
  data.keepalive = ctx.keepalive;
  return AgreeAndMove(agreed, local, data);
}

absl::Status Transport::AgreeAndMove(const ExchangeLayout& layout, const absl::Status& local,
                                     const ExchangeData& data) {
  RETURN_IF_ERROR(Agree(layout, local));
  return Move(layout, data.send, data.recv);
}

}  // namespace tutti
