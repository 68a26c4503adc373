// The LLM-phase state of every rank while documents are being placed: token
// fill of each sequence slot and the rank's LLM cost, padded or unpadded.
// Not thread-safe; one planner thread owns it.
#ifndef TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_SEQUENCE_STATE_H_
#define TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_SEQUENCE_STATE_H_

#include <cstdint>
#include <vector>

#include "common/cost_model.h"
#include "services/packer/core/post_balancing/dispatch_types.h"

namespace tutti::dispatch {

class SequenceState {
 public:
  SequenceState(const ClusterShape& cluster, const SlotLayout& slots, const CostModel& cost,
                bool padded);

  // The sequence of `rank` that a document of `tokens` tokens (`images` of
  // them image tokens) and modality `vl` goes to, and the rank's cost
  // increase. Unpadded: the sequence with the most room (with tight_fit: the
  // least room that fits, which packs better). Padded: the smallest cost
  // increase, then room as above. False when no sequence of that modality has
  // room for its tokens and, under slots.img_cap, its image tokens.
  bool BestSequence(uint32_t rank, uint32_t tokens, bool vl, uint32_t* seq, double* delta,
                    uint32_t images = 0) const;
  // Cost decrease of `rank` if a document leaves sequence `seq`.
  double RemoveDelta(uint32_t rank, uint32_t seq, uint32_t tokens, double doc_cost) const;

  // Cost change of `rank` if a document of out_tokens in sequence `seq` is
  // replaced by one of in_tokens (a swap's half). False if it does not fit.
  // Image tokens are held to slots.img_cap like tokens to seq_len.
  bool ReplaceDelta(uint32_t rank, uint32_t seq, uint32_t out_tokens, double out_cost,
                    uint32_t in_tokens, double in_cost, double* delta, uint32_t out_images = 0,
                    uint32_t in_images = 0) const;

  void Add(uint32_t rank, uint32_t seq, uint32_t tokens, double doc_cost, uint32_t images = 0);
  void Remove(uint32_t rank, uint32_t seq, uint32_t tokens, double doc_cost, uint32_t images = 0);

  double cost(uint32_t rank) const { return cost_[rank]; }
  const std::vector<double>& costs() const { return cost_; }
  uint32_t tokens(uint32_t rank, uint32_t seq) const { return tokens_[rank * seqs_ + seq]; }
  // Tokens the fullest-room sequence of the modality can still take.
  uint32_t room(uint32_t rank, bool vl) const;
  bool padded() const { return padded_; }
  void set_tight_fit(bool tight) { tight_fit_ = tight; }
  const SlotLayout& slots() const { return slots_; }

 private:
  double MicroBatchCost(uint32_t mb, uint32_t longest) const;
  uint32_t Longest(uint32_t rank, uint32_t mb, uint32_t except_seq, uint32_t except_tokens) const;

  SlotLayout slots_;
  CostModel model_;
  bool padded_;
  bool tight_fit_ = false;
  uint32_t seqs_;
  std::vector<uint32_t> tokens_;   // rank-major, per sequence slot
  std::vector<uint32_t> images_;   // rank-major, per sequence slot (under img_cap)
  std::vector<uint32_t> longest_;  // rank-major, per micro-batch (padded)
  std::vector<double> cost_;       // per rank
};

}  // namespace tutti::dispatch

#endif  // TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_SEQUENCE_STATE_H_
