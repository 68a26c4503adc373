#include "services/packer/core/exchange.h"

#include <algorithm>
#include <vector>

namespace tutti::packer {
namespace {

// Stable counting sort of `in` by key[x] into rows [0, rows).
void CountingSort(const std::vector<uint32_t>& in, uint32_t rows, const uint32_t* key,
                  std::vector<uint32_t>* begin, std::vector<uint32_t>* out) {
  begin->assign(rows + 1, 0);
  for (uint32_t x : in) ++(*begin)[key[x] + 1];
  for (uint32_t r = 0; r < rows; ++r) (*begin)[r + 1] += (*begin)[r];
  thread_local std::vector<uint32_t> at;
  at.assign(begin->begin(), begin->end() - 1);
  out->resize(in.size());
  for (uint32_t x : in) (*out)[at[key[x]]++] = x;
}

// Every encoder item in its LLM rank's input_ids order (ranks ascending,
// then sequences in order, a document's images then its audio clips) into
// `by_llm`. False when the documents do not hold every encoder item exactly
// once.
bool InputIdsOrder(const StepPlanData& plan, std::vector<uint32_t>* by_llm) {
  const uint32_t W = plan.world_size;
  const uint32_t I = static_cast<uint32_t>(plan.images.size());
  const uint32_t n = plan.num_encoder_items();
  if (plan.docs.rows() != W * plan.seqs_per_rank() ||
      plan.docs.items.size() != plan.samples.size()) {
    return false;
  }
  // Each sample's items, read in record order (the records are large; the
  // documents' order below visits them scattered).
  struct Items {
    uint32_t first_image, images, first_audio, audio;
  };
  thread_local std::vector<Items> items;
  items.resize(plan.samples.size());
  uint64_t held = 0;  // the documents hold every sample once
  for (size_t k = 0; k < plan.samples.size(); ++k) {
    const PlannedSample& ps = plan.samples[k];
    items[k] = Items{ps.first_image, ps.cost.images, ps.first_audio, ps.cost.audio};
    held += ps.cost.images + ps.cost.audio;
  }
  if (held != n) return false;
  by_llm->clear();
  by_llm->reserve(n);
  // The rows are rank-major (rank * sequences + sequence), so the documents
  // in row order are every rank's input_ids order, rank after rank.
  for (uint32_t sample : plan.docs.items) {
    const Items& x = items[sample];
    for (uint32_t i = x.first_image; i < x.first_image + x.images; ++i) by_llm->push_back(i);
    for (uint32_t a = x.first_audio; a < x.first_audio + x.audio; ++a) by_llm->push_back(I + a);
  }
  return true;
}

// Each rank's encoder images and audio clips in the order of its sends.
void FollowSends(StepPlanData* plan) {
  const uint32_t I = static_cast<uint32_t>(plan->images.size());
  uint32_t image_at = 0, audio_at = 0;
  for (uint32_t item : plan->sends.items) {
    if (item < I) {
      plan->enc_images.items[image_at++] = item;
    } else {
      plan->enc_audio.items[audio_at++] = item - I;
    }
  }
}

}  // namespace

void BuildExchange(StepPlanData* plan) {
  const uint32_t n = plan->num_encoder_items();
  thread_local std::vector<uint32_t> enc, llm;
  enc.resize(n);
  llm.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    enc[i] = plan->EncRank(i);
    llm[i] = plan->LlmRank(i);
  }
  BuildExchange(enc.data(), llm.data(), plan);
}

void BuildExchange(const uint32_t* enc, const uint32_t* llm, StepPlanData* plan) {
  const uint32_t W = plan->world_size;
  const uint32_t n = plan->num_encoder_items();
  const uint32_t I = static_cast<uint32_t>(plan->images.size());
  thread_local std::vector<uint32_t> ids, tmp, kind, scratch_begin;
  ids.resize(n);
  kind.resize(n);
  bool all_self = true;
  for (uint32_t i = 0; i < n; ++i) {
    ids[i] = i;
    kind[i] = i < I ? 0 : 1;
    all_self &= enc[i] == llm[i];
  }
  plan->inter_node_bytes = 0;
  plan->intra_node_bytes = 0;
  plan->items_move = !all_self;
  if (all_self) {
    // Pre-balancing: every rank sends its encoder outputs to itself.
    CountingSort(ids, W, enc, &plan->sends.begin, &plan->sends.items);
    plan->recvs = plan->sends;
    return;
  }
  // By (LLM rank, input_ids order), or by item where the documents do not
  // say; then stable passes from the least significant key up: sends by
  // (encoder rank, LLM rank, kind, input_ids order), recvs by (LLM rank,
  // encoder rank, kind, input_ids order).
  if (!InputIdsOrder(*plan, &tmp)) tmp = ids;
  CountingSort(tmp, 2, kind.data(), &scratch_begin, &ids);
  CountingSort(ids, W, llm, &scratch_begin, &tmp);
  CountingSort(tmp, W, enc, &plan->sends.begin, &plan->sends.items);
  CountingSort(plan->sends.items, W, llm, &plan->recvs.begin, &plan->recvs.items);
  FollowSends(plan);
  const uint32_t rpn = plan->ranks_per_node == 0 ? 1 : plan->ranks_per_node;
  for (uint32_t i = 0; i < n; ++i) {
    if (enc[i] == llm[i]) continue;
    (enc[i] / rpn == llm[i] / rpn ? plan->intra_node_bytes : plan->inter_node_bytes) +=
        plan->OutputBytes(i);
  }
}

void ClearLoadExchange(StepPlanData* plan) {
  plan->remote_load_bytes = 0;
  plan->load_sends.begin.assign(plan->world_size + 1, 0);
  plan->load_sends.items.clear();
  plan->load_recvs = plan->load_sends;
}

void BuildLoadExchange(StepPlanData* plan) {
  const uint32_t W = plan->world_size;
  // A remote load with its keys beside it (the sorts below read them in
  // sequence, not scattered through per-item arrays).
  struct Load {
    uint32_t item, src, dst;
  };
  thread_local std::vector<Load> loads, tmp;
  thread_local std::vector<uint32_t> scratch_begin, at;
  loads.clear();
  plan->remote_load_bytes = 0;
  // Load items in their order: images, audio clips, then samples' token ids.
  auto remote = [&](uint32_t i) {
    loads.push_back(Load{i, plan->LoadSource(i), plan->LoadDest(i)});
    plan->remote_load_bytes += plan->LoadBytes(i);
  };
  const uint32_t I = static_cast<uint32_t>(plan->images.size());
  const uint32_t A = static_cast<uint32_t>(plan->audio.size());
  for (uint32_t i = 0; i < I; ++i) {
    if (plan->images[i].remote_load) remote(i);
  }
  for (uint32_t i = 0; i < A; ++i) {
    if (plan->audio[i].remote_load) remote(I + i);
  }
  for (uint32_t i = 0; i < plan->samples.size(); ++i) {
    if (plan->samples[i].text_remote) remote(I + A + i);
  }
  if (loads.empty()) {
    ClearLoadExchange(plan);
    return;
  }
  // Stable counting sorts of `in` by key: the loads (into *out) or their
  // items (into *items).
  auto sort = [&](const std::vector<Load>& in, auto key, std::vector<uint32_t>* begin,
                  std::vector<Load>* out, std::vector<uint32_t>* items) {
    begin->assign(W + 1, 0);
    for (const Load& x : in) ++(*begin)[key(x) + 1];
    for (uint32_t r = 0; r < W; ++r) (*begin)[r + 1] += (*begin)[r];
    at.assign(begin->begin(), begin->end() - 1);
    if (out != nullptr) {
      out->resize(in.size());
      for (const Load& x : in) (*out)[at[key(x)]++] = x;
    } else {
      items->resize(in.size());
      for (const Load& x : in) (*items)[at[key(x)]++] = x.item;
    }
  };
  auto src = [](const Load& x) { return x.src; };
  auto dst = [](const Load& x) { return x.dst; };
  // sends: by (source, destination, item); recvs: by (destination, source, item)
  sort(loads, dst, &scratch_begin, &tmp, nullptr);
  sort(tmp, src, &plan->load_sends.begin, nullptr, &plan->load_sends.items);
  sort(loads, src, &scratch_begin, &tmp, nullptr);
  sort(tmp, dst, &plan->load_recvs.begin, nullptr, &plan->load_recvs.items);
}

}  // namespace tutti::packer
