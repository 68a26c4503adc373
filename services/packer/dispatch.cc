#include "services/packer/dispatch.h"

#include <algorithm>

#include "services/packer/rank_heap.h"

namespace tutti::packer {
namespace {

class ColocatedDispatcher final : public Dispatcher {
 public:
  absl::Status Dispatch(const DispatchInput& in, DispatchOutput* out) const override {
    PackProblem p = in.pack;
    p.balance_vit = true;
    if (absl::Status s = in.strategy->Pack(p, &out->llm); !s.ok()) return s;
    const uint32_t per = std::max<uint32_t>(1, p.vl_seqs_per_rank);
    out->image_rank.resize(in.image_owner.size());
    for (size_t k = 0; k < in.image_owner.size(); ++k) {
      out->image_rank[k] = out->llm.vl_slot[in.image_owner[k]] / per;
    }
    out->audio_rank.resize(in.audio_owner.size());
    for (size_t k = 0; k < in.audio_owner.size(); ++k) {
      out->audio_rank[k] = out->llm.vl_slot[in.audio_owner[k]] / per;
    }
    return absl::OkStatus();
  }
};

class LptDispatcher final : public Dispatcher {
 public:
  absl::Status Dispatch(const DispatchInput& in, DispatchOutput* out) const override {
    PackProblem p = in.pack;
    p.balance_vit = false;
    if (absl::Status s = in.strategy->Pack(p, &out->llm); !s.ok()) return s;
    out->image_rank.resize(in.image_cost.size());
    LptAssign(in.image_cost, p.ranks, out->image_rank.data());
    out->audio_rank.resize(in.audio_cost.size());
    LptAssign(in.audio_cost, p.ranks, out->audio_rank.data());
    return absl::OkStatus();
  }
};

}  // namespace

void LptAssign(absl::Span<const double> cost, uint32_t ranks, uint32_t* rank_out) {
  if (cost.empty()) return;
  thread_local std::vector<std::pair<double, uint32_t>> order;
  thread_local std::vector<double> load;
  thread_local RankHeap heap;
  order.clear();
  for (uint32_t i = 0; i < cost.size(); ++i) order.emplace_back(-cost[i], i);
  std::sort(order.begin(), order.end());
  load.assign(ranks, 0.0);
  heap.Init(ranks, load.data());
  for (const auto& [neg, i] : order) {
    const uint32_t r = heap.Top();
    rank_out[i] = r;
    load[r] -= neg;
    heap.Update(r);
  }
}

std::unique_ptr<Dispatcher> MakeColocatedDispatcher() {
  return std::make_unique<ColocatedDispatcher>();
}
std::unique_ptr<Dispatcher> MakeLptDispatcher() { return std::make_unique<LptDispatcher>(); }

}  // namespace tutti::packer
