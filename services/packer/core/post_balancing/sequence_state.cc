#include "services/packer/core/post_balancing/sequence_state.h"

#include <algorithm>

namespace tutti::dispatch {

SequenceState::SequenceState(const ClusterShape& cluster, const SlotLayout& slots,
                             const CostModel& cost, bool padded)
    : slots_(slots),
      model_(cost),
      padded_(padded),
      seqs_(slots.sequences()),
      tokens_(size_t{cluster.world_size} * slots.sequences(), 0),
      images_(slots.img_cap > 0 ? size_t{cluster.world_size} * slots.sequences() : 0, 0),
      longest_(size_t{cluster.world_size} * slots.micro_batches(), 0),
      cost_(cluster.world_size, 0.0) {}

double SequenceState::MicroBatchCost(uint32_t mb, uint32_t longest) const {
  return slots_.micro_batch_size(mb) * model_.Llm(longest);
}

uint32_t SequenceState::Longest(uint32_t rank, uint32_t mb, uint32_t except_seq,
                                uint32_t except_tokens) const {
  const uint32_t first = slots_.first_sequence(mb);
  uint32_t longest = 0;
  for (uint32_t q = first; q < first + slots_.micro_batch_size(mb); ++q) {
    uint32_t t = tokens_[rank * seqs_ + q];
    if (q == except_seq) t -= except_tokens;
    longest = std::max(longest, t);
  }
  return longest;
}

bool SequenceState::BestSequence(uint32_t rank, uint32_t tokens, bool vl, uint32_t* seq,
                                 double* delta, uint32_t images) const {
  const uint32_t begin = vl ? slots_.text_sequences() : 0;
  const uint32_t end = vl ? slots_.sequences() : slots_.text_sequences();
  const uint32_t* fill = &tokens_[rank * seqs_];
  bool found = false;
  double best_delta = 0;
  uint32_t best_fill = 0, best_seq = 0;
  for (uint32_t q = begin; q < end; ++q) {
    if (fill[q] + tokens > slots_.seq_len) continue;
    if (slots_.img_cap > 0 && images_[rank * seqs_ + q] + images > slots_.img_cap) continue;
    double d = 0;
    if (padded_) {
      const uint32_t mb = slots_.micro_batch_of(q);
      const uint32_t old_longest = longest_[rank * slots_.micro_batches() + mb];
      const uint32_t new_longest = std::max(old_longest, fill[q] + tokens);
      d = MicroBatchCost(mb, new_longest) - MicroBatchCost(mb, old_longest);
    }
    const bool better_fill = tight_fit_ ? fill[q] > best_fill : fill[q] < best_fill;
    if (!found || d < best_delta || (d == best_delta && better_fill)) {
      found = true, best_delta = d, best_fill = fill[q], best_seq = q;
    }
  }
  if (!found) return false;
  *seq = best_seq;
  *delta = padded_ ? best_delta : model_.Llm(tokens);
  return true;
}

double SequenceState::RemoveDelta(uint32_t rank, uint32_t seq, uint32_t tokens,
                                  double doc_cost) const {
  if (!padded_) return doc_cost;
  const uint32_t mb = slots_.micro_batch_of(seq);
  const uint32_t old_longest = longest_[rank * slots_.micro_batches() + mb];
  return MicroBatchCost(mb, old_longest) - MicroBatchCost(mb, Longest(rank, mb, seq, tokens));
}

bool SequenceState::ReplaceDelta(uint32_t rank, uint32_t seq, uint32_t out_tokens, double out_cost,
                                 uint32_t in_tokens, double in_cost, double* delta,
                                 uint32_t out_images, uint32_t in_images) const {
  const uint32_t fill = tokens_[rank * seqs_ + seq] - out_tokens + in_tokens;
  if (fill > slots_.seq_len) return false;
  if (slots_.img_cap > 0 && images_[rank * seqs_ + seq] - out_images + in_images > slots_.img_cap) {
    return false;
  }
  if (!padded_) {
    *delta = in_cost - out_cost;
    return true;
  }
  const uint32_t mb = slots_.micro_batch_of(seq);
  const uint32_t old_longest = longest_[rank * slots_.micro_batches() + mb];
  const uint32_t new_longest = std::max(Longest(rank, mb, seq, out_tokens), fill);
  *delta = MicroBatchCost(mb, new_longest) - MicroBatchCost(mb, old_longest);
  return true;
}

void SequenceState::Add(uint32_t rank, uint32_t seq, uint32_t tokens, double doc_cost,
                        uint32_t images) {
  if (slots_.img_cap > 0) images_[rank * seqs_ + seq] += images;
  uint32_t& fill = tokens_[rank * seqs_ + seq];
  fill += tokens;
  if (!padded_) {
    cost_[rank] += doc_cost;
    return;
  }
  const uint32_t mb = slots_.micro_batch_of(seq);
  uint32_t& longest = longest_[rank * slots_.micro_batches() + mb];
  if (fill > longest) {
    cost_[rank] += MicroBatchCost(mb, fill) - MicroBatchCost(mb, longest);
    longest = fill;
  }
}

void SequenceState::Remove(uint32_t rank, uint32_t seq, uint32_t tokens, double doc_cost,
                           uint32_t images) {
  if (slots_.img_cap > 0) images_[rank * seqs_ + seq] -= images;
  if (!padded_) {
    tokens_[rank * seqs_ + seq] -= tokens;
    cost_[rank] -= doc_cost;
    return;
  }
  const uint32_t mb = slots_.micro_batch_of(seq);
  uint32_t& longest = longest_[rank * slots_.micro_batches() + mb];
  const uint32_t after = Longest(rank, mb, seq, tokens);
  tokens_[rank * seqs_ + seq] -= tokens;
  if (after != longest) {
    cost_[rank] -= MicroBatchCost(mb, longest) - MicroBatchCost(mb, after);
    longest = after;
  }
}

uint32_t SequenceState::room(uint32_t rank, bool vl) const {
  const uint32_t begin = vl ? slots_.text_sequences() : 0;
  const uint32_t end = vl ? slots_.sequences() : slots_.text_sequences();
  uint32_t best = 0;
  for (uint32_t q = begin; q < end; ++q) {
    best = std::max(best, slots_.seq_len - tokens_[rank * seqs_ + q]);
  }
  return best;
}

}  // namespace tutti::dispatch
