#include "services/packer/exchange.h"

#include <vector>

namespace tutti::packer {
namespace {

// Stable counting sort of items by key(item) into [0, rows).
template <typename Key>
void CountingSort(const std::vector<uint32_t>& in, uint32_t rows, Key key,
                  std::vector<uint32_t>* begin, std::vector<uint32_t>* out) {
  begin->assign(rows + 1, 0);
  for (uint32_t x : in) ++(*begin)[key(x) + 1];
  for (uint32_t r = 0; r < rows; ++r) (*begin)[r + 1] += (*begin)[r];
  thread_local std::vector<uint32_t> at;
  at.assign(begin->begin(), begin->end() - 1);
  out->resize(in.size());
  for (uint32_t x : in) (*out)[at[key(x)]++] = x;
}

}  // namespace

void BuildExchange(StepPlanData* plan) {
  const uint32_t W = plan->world_size;
  const uint32_t n = plan->num_encoder_items();
  thread_local std::vector<uint32_t> ids, tmp, scratch_begin;
  ids.resize(n);
  for (uint32_t i = 0; i < n; ++i) ids[i] = i;
  // sends: by (encoder rank, LLM rank, item)
  CountingSort(
      ids, W, [&](uint32_t i) { return plan->LlmRank(i); }, &scratch_begin, &tmp);
  CountingSort(
      tmp, W, [&](uint32_t i) { return plan->EncRank(i); }, &plan->sends.begin, &plan->sends.items);
  // recvs: by (LLM rank, encoder rank, item)
  CountingSort(
      ids, W, [&](uint32_t i) { return plan->EncRank(i); }, &scratch_begin, &tmp);
  CountingSort(
      tmp, W, [&](uint32_t i) { return plan->LlmRank(i); }, &plan->recvs.begin, &plan->recvs.items);
  plan->inter_node_bytes = 0;
  plan->intra_node_bytes = 0;
  const uint32_t rpn = plan->ranks_per_node == 0 ? 1 : plan->ranks_per_node;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t from = plan->EncRank(i), to = plan->LlmRank(i);
    if (from == to) continue;
    (from / rpn == to / rpn ? plan->intra_node_bytes : plan->inter_node_bytes) +=
        plan->OutputBytes(i);
  }
}

}  // namespace tutti::packer
