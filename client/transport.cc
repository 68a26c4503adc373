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
  const ExchangeLayout& agreed =
      layout.ok() ? *layout : EmptyLayout(dir, rank(), world_size(), ctx.step);
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
  if (data.send_items != nullptr) return MoveItems(layout, *data.send_items, *data.recv_items);
  return Move(layout, data.send, data.recv);
}

absl::Status Transport::MoveItems(const ExchangeLayout&,
                                  const std::vector<std::vector<ItemBuffer>>&,
                                  const std::vector<std::vector<ItemBuffer>>&) {
  return absl::UnimplementedError(absl::StrCat(
      "the ", name(), " transport moves contiguous buffers only (Exchange), not items"));
}

namespace {

// The direction's send and receive transfer lists.
std::pair<const google::protobuf::RepeatedPtrField<v1::Transfer>*,
          const google::protobuf::RepeatedPtrField<v1::Transfer>*>
Lists(const v1::RankPlan& plan, ExchangeDirection dir) {
  const v1::Exchange& ex = dir == ExchangeDirection::kLoad ? plan.load_exchange() : plan.exchange();
  if (dir == ExchangeDirection::kBackward) return {&ex.recvs(), &ex.sends()};
  return {&ex.sends(), &ex.recvs()};
}

// Groups `buffers` by peer as `list` lists its items; INVALID_ARGUMENT when
// the counts or sizes differ from the plan's.
absl::Status GroupItems(const google::protobuf::RepeatedPtrField<v1::Transfer>& list,
                        const std::vector<ItemBuffer>& buffers, uint32_t world, const char* what,
                        const std::string& where, std::vector<std::vector<ItemBuffer>>* out) {
  out->assign(world, {});
  size_t k = 0;
  for (const v1::Transfer& t : list) {
    for (const v1::TransferItem& item : t.items()) {
      if (k >= buffers.size()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", buffers.size(), " ", what,
                                                       " item buffers but the plan lists more"));
      }
      if (buffers[k].bytes != item.bytes()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", what, " item ", k, " (sample ", item.sample_id(), ") is ",
                         item.bytes(), " bytes in the plan but its buffer has ", buffers[k].bytes));
      }
      if (t.peer() < world) (*out)[t.peer()].push_back(buffers[k]);
      ++k;
    }
  }
  if (k != buffers.size()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", buffers.size(), " ", what,
                                                   " item buffers but the plan lists ", k));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Transport::ExchangeItems(const v1::RankPlan& plan, ExchangeDirection dir,
                                      const std::vector<ItemBuffer>& send,
                                      const std::vector<ItemBuffer>& recv,
                                      const ExchangeContext& ctx) {
  absl::MutexLock lock(&run_mu_);
  absl::StatusOr<ExchangeLayout> layout = BuildExchangeLayout(plan, dir, rank(), world_size(), ctx);
  absl::Status local = ctx.refusal.ok() ? layout.status() : ctx.refusal;
  std::vector<std::vector<ItemBuffer>> send_by_peer, recv_by_peer;
  const auto [send_list, recv_list] = Lists(plan, dir);
  const std::string where = ExchangeWhere(ctx.step, rank());
  if (local.ok()) {
    local = GroupItems(*send_list, send, world_size(), "send", where, &send_by_peer);
  }
  if (local.ok()) {
    local = GroupItems(*recv_list, recv, world_size(), "receive", where, &recv_by_peer);
  }
  const ExchangeLayout& agreed =
      layout.ok() ? *layout : EmptyLayout(dir, rank(), world_size(), ctx.step);
  ExchangeData data;
  data.send_items = &send_by_peer;
  data.recv_items = &recv_by_peer;
  data.scratch_recv = ctx.scratch_recv;
  data.keepalive = ctx.keepalive;
  return AgreeAndMove(agreed, local, data);
}

}  // namespace tutti
