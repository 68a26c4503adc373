// The tutti strategy's working state (tutti_strategy.cc describes the
// steps): the constants of its search, every sequence's room, each
// modality's samples and per-rank lists, the per-rank loads and heaps, and
// the score by which plans are compared. Internal to the strategy.
#ifndef TUTTI_SERVICES_PACKER_CORE_TUTTI_STATE_H_
#define TUTTI_SERVICES_PACKER_CORE_TUTTI_STATE_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "services/packer/core/packing.h"
#include "services/packer/core/rank_heap.h"

namespace tutti::packer::tutti_internal {

// Least loaded ranks a local-search round tries as partners; a ViT round
// that finds no change among them tries again with kWideReceivers (the
// ranks with the least ViT cost may be the ones whose VL sequences or LLM
// budget are full). In the LLM phase the wider retry gains less than 0.0001
// of the bound and costs a fifth of the plan time at W = 2560.
constexpr uint32_t kReceivers = 6;
constexpr uint32_t kWideReceivers = 64;
// A ViT round that finds no move or swap even among kWideReceivers ranks
// re-splits the VL samples of the slowest rank and a receiver in every way
// when the two hold at most this many (2^n assignments each).
constexpr uint32_t kResplitItems = 12;
// Slowest ranks a re-split is tried for, slowest first.
constexpr uint32_t kResplitSlow = 8;
// Pair passes per phase before its rounds, and the fast ranks a slow one
// tries in a pass: in the ViT phase several, since the fastest ranks may be
// ones the LLM cap closes to VL samples.
constexpr int kPairPasses = 2;
constexpr uint32_t kPairTriesVit = 4;
constexpr uint32_t kPairTriesLlm = 1;
// A phase's rounds stop once the last kStallRounds of them lowered its
// maximum by less than kStall of its lower bound (a time-independent
// budget: plans stay machine independent).
constexpr uint64_t kStallRounds = 64;
constexpr double kStall = 1e-4;
// Ranks visited (least loaded first) to find receivers with room.
constexpr uint32_t kRoomScan = 64;
// A phase is done once its maximum is within this of its lower bound.
constexpr double kDone = 1e-4;
// A move must lower the slowest rank by more than this (relative), so that
// rounding noise never counts as progress.
constexpr double kGain = 1e-12;
// Swaps try every pair of two ranks' items up to this many pairs.
constexpr size_t kAllPairs = 400;
// A text document costing at least this share of the LLM lower bound is a
// large one, and a rank holding one takes VL samples only up to the bound
// plus kGiantSlack.
constexpr double kGiant = 0.5;
constexpr double kGiantSlack = 0.005;
// Items worth less than this share of a rank's mean load are placed in
// batches of W / kBatchDivisor (LptBatches).
constexpr double kSmall = 0.05;
constexpr uint32_t kBatchDivisor = 4;
// Items fetched ahead when items are visited in key order.
constexpr size_t kPrefetch = 16;

// Token and image-token use of every sequence of one modality.
class Rooms {
 public:
  void Init(uint32_t ranks, uint32_t per, uint32_t seq_len, uint32_t img_cap) {
    per_ = per;
    seq_len_ = seq_len;
    img_cap_ = img_cap;
    used_.assign(size_t{ranks} * per, 0);
    img_.assign(img_cap > 0 ? size_t{ranks} * per : 0, 0);
    max_room_.assign(ranks, seq_len);
  }
  uint32_t per() const { return per_; }
  uint32_t seq_len() const { return seq_len_; }
  uint32_t img_cap() const { return img_cap_; }
  // The sequence of rank r with the fewest tokens that takes `it` once
  // `out` (an item in sequence out_slot of rank r, or none) has left it;
  // ties go to the lower sequence. -1 when none does.
  int Fit(uint32_t r, const PackItem& it, const PackItem* out = nullptr,
          uint32_t out_slot = UINT32_MAX) const {
    int best = -1;
    uint32_t best_used = 0;
    const size_t base = size_t{r} * per_;
    for (uint32_t q = 0; q < per_; ++q) {
      const bool freed = out != nullptr && base + q == out_slot;
      const uint32_t used = used_[base + q] - (freed ? out->tokens : 0);
      if (used + it.tokens > seq_len_) continue;
      if (img_cap_ > 0 &&
          img_[base + q] - (freed ? out->image_tokens : 0) + it.image_tokens > img_cap_) {
        continue;
      }
      if (best < 0 || used < best_used) best = static_cast<int>(q), best_used = used;
    }
    return best;
  }
  // The most tokens a sequence of rank r has room for.
  uint32_t MaxRoom(uint32_t r) const { return max_room_[r]; }
  void Add(uint32_t slot, const PackItem& it) {
    used_[slot] += it.tokens;
    if (img_cap_ > 0) img_[slot] += it.image_tokens;
    Remeasure(slot / per_);
  }
  void Remove(uint32_t slot, const PackItem& it) {
    used_[slot] -= it.tokens;
    if (img_cap_ > 0) img_[slot] -= it.image_tokens;
    Remeasure(slot / per_);
  }

 private:
  void Remeasure(uint32_t r) {
    uint32_t room = 0;
    for (uint32_t q = 0; q < per_; ++q) room = std::max(room, seq_len_ - used_[r * per_ + q]);
    max_room_[r] = room;
  }

  uint32_t per_ = 1, seq_len_ = 0, img_cap_ = 0;
  std::vector<uint32_t> used_, img_;
  std::vector<uint32_t> max_room_;  // per rank: MaxRoom
};

// (key, item) pairs in the order of std::pair's operator<, without its
// three-way comparison of doubles (the search's hot comparison).
struct KeyLess {
  bool operator()(const std::pair<double, uint32_t>& a,
                  const std::pair<double, uint32_t>& b) const {
    return a.first < b.first || (a.first == b.first && a.second < b.second);
  }
};

// One modality's samples: their sequences, slots and per-rank lists.
struct Side {
  absl::Span<const PackItem> items;
  std::vector<uint32_t>* slot = nullptr;
  Rooms rooms;
  bool vl = false;
  std::vector<std::vector<uint32_t>> lists;  // per rank, the items it holds
  std::vector<uint32_t> pos;                 // item -> index in its rank's list

  uint32_t RankOf(uint32_t i) const { return (*slot)[i] / rooms.per(); }
  void BuildLists(uint32_t W) {
    lists.resize(W);
    for (auto& l : lists) l.clear();
    pos.resize(items.size());
    for (uint32_t i = 0; i < items.size(); ++i) {
      std::vector<uint32_t>& l = lists[RankOf(i)];
      pos[i] = static_cast<uint32_t>(l.size());
      l.push_back(i);
    }
    for (int k = 0; k < 2; ++k) {
      sorted[k].resize(W);
      fresh[k].assign(W, 0);
    }
  }
  // Item i off its rank's list (before its slot changes), and onto its
  // new rank's (after). Sorted's lists of the two ranks are kept sorted
  // in place: the same order as sorting again (keys and items are unique
  // pairs), without a sort after every change.
  void Unlist(uint32_t i) {
    const uint32_t r = RankOf(i);
    std::vector<uint32_t>& l = lists[r];
    const uint32_t last = l.back();
    l[pos[i]] = last;
    pos[last] = pos[i];
    l.pop_back();
    for (int k = 0; k < 2; ++k) {
      if (!fresh[k][r]) continue;
      std::vector<std::pair<double, uint32_t>>& v = sorted[k][r];
      const std::pair<double, uint32_t> entry(KeyOf(k, i), i);
      v.erase(std::lower_bound(v.begin(), v.end(), entry, KeyLess()));
    }
  }
  void Relist(uint32_t i) {
    const uint32_t r = RankOf(i);
    std::vector<uint32_t>& l = lists[r];
    pos[i] = static_cast<uint32_t>(l.size());
    l.push_back(i);
    for (int k = 0; k < 2; ++k) {
      if (!fresh[k][r]) continue;
      std::vector<std::pair<double, uint32_t>>& v = sorted[k][r];
      const std::pair<double, uint32_t> entry(KeyOf(k, i), i);
      v.insert(std::lower_bound(v.begin(), v.end(), entry, KeyLess()), entry);
    }
  }
  // Sorted's key k (VitOf::kId, LlmOf::kId) of item i.
  double KeyOf(int k, uint32_t i) const { return k == 0 ? items[i].vit : items[i].llm; }
  // Rank r's items as (key, item), sorted; kept until the rank's list
  // changes.
  template <typename Key>
  const std::vector<std::pair<double, uint32_t>>& Sorted(uint32_t r, Key key) {
    std::vector<std::pair<double, uint32_t>>& v = sorted[Key::kId][r];
    if (!fresh[Key::kId][r]) {
      v.clear();
      for (uint32_t i : lists[r]) v.emplace_back(key(items[i]), i);
      std::sort(v.begin(), v.end(), KeyLess());
      fresh[Key::kId][r] = 1;
    }
    return v;
  }

  // Per key (VitOf, LlmOf) and rank: Sorted's lists and whether each is
  // current.
  std::vector<std::vector<std::pair<double, uint32_t>>> sorted[2];
  std::vector<uint8_t> fresh[2];
};

struct State {
  std::vector<double> vit, llm, key, neg_vit, neg_llm;
  RankHeap vit_min, llm_min, vit_max, llm_max, lpt;
  Side text, vl;
  std::vector<uint64_t> order, tmp;   // (~key bits << 32 | item), largest key first
  std::vector<uint64_t> kept, moved;  // LptBatches: ranks whose key stayed, changed
  std::vector<uint64_t> radix;        // RadixSort64's scratch
  std::vector<uint32_t> bits_of;      // LptBatches: each rank's key
  std::vector<std::pair<uint32_t, uint32_t>> sleeping;  // (max room, rank), a max-heap
  std::vector<uint32_t> fell_asleep;
  std::vector<double> scratch;
  std::vector<uint8_t> holds_giant;
  double vit_lb = 0, llm_lb = 0;  // lower bounds: max(mean, largest item)
  double llm_budget = 0;          // LLM cost allowed on a rank holding a large document
  double llm_cap = -1;            // the ViT search's LLM cap; -1: the LLM maximum
  bool text_placed = false;
  std::vector<uint64_t> by_load;         // PairPass: (load bits << 32 | rank), fastest first
  std::vector<uint32_t> both;            // Resplit: the two ranks' VL samples
  uint64_t vl_changes = 0;               // changes that moved VL samples
  uint64_t resplit_failed = UINT64_MAX;  // vl_changes when Resplit last found nothing
  uint64_t pair_tries = 0;               // rank pairs the last pair pass tried
};

// Keys as types, so that the hot loops inline them.
struct VitOf {
  static constexpr int kId = 0;
  double operator()(const PackItem& it) const { return it.vit; }
};
struct LlmOf {
  static constexpr int kId = 1;
  double operator()(const PackItem& it) const { return it.llm; }
};
static_assert(VitOf::kId == 0 && LlmOf::kId == 1, "Side::KeyOf reads the keys by these ids");
struct TokensOf {
  double operator()(const PackItem& it) const { return it.tokens; }
};

// Stops a phase's rounds once they stall (kStallRounds, kStall).
struct Progress {
  uint64_t since = 0;  // rounds since `mark` was taken
  double mark = 0;     // the phase's maximum kStallRounds rounds ago
  bool stalled = false;
  // Whether the next round may run, given the phase's maximum and bound.
  bool Go(double max, double lower_bound) {
    if (stalled) return false;
    if (since == kStallRounds) {
      if (mark - max < kStall * lower_bound) {
        stalled = true;
        return false;
      }
      since = 0;
    }
    if (since == 0) mark = max;
    ++since;
    return true;
  }
};

// A plan's two phases: each one's maximum over its lower bound.
struct Score {
  double vit = 0, llm = 0;
  // The slower phase lower (both within kDone of their bounds count as
  // equal: where the search stops), or the same and the sum of both lower.
  bool Better(const Score& o) const {
    const double mine = std::max({vit, llm, 1 + kDone});
    const double theirs = std::max({o.vit, o.llm, 1 + kDone});
    if (mine != theirs) return mine < theirs;
    return vit + llm < o.vit + o.llm;
  }
};

// A phase's maximum.
inline double Max(const State& st, bool vit_phase) {
  return vit_phase ? st.vit[st.vit_max.Top()] : st.llm[st.llm_max.Top()];
}

}  // namespace tutti::packer::tutti_internal

#endif  // TUTTI_SERVICES_PACKER_CORE_TUTTI_STATE_H_
