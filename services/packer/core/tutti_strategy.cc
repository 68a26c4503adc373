// The "tutti" strategy: balances, across ranks, the ViT cost (pre-balancing)
// and the LLM tokens and LLM cost, all at once.
//
// Loads are normalised by their means over ranks (V*, T*, C*); a rank's LLM
// load is max(tokens / T*, w * cost / C*). Samples are placed largest first
// in three groups, each onto the best of a few candidate ranks taken from
// indexed heaps (O(log W) per sample, O(n log n) per step):
//   1. large text documents (at least kLargeText of a rank's mean LLM load),
//      onto the ranks with the lowest LLM load: they claim a rank's LLM
//      budget before anything else;
//   2. VL samples (pre-balancing), largest by their share of the mean ViT
//      load or of the mean VL tokens, onto the rank minimising
//      max(ViT / V*, w * VL tokens / VLT*): ViT leads, VL tokens keep every
//      rank's VL sequences filling alike. A rank whose LLM budget is (nearly)
//      spent by large documents is closed to VL samples, and a sample that
//      would push a rank over its budget goes there only as a last resort.
//      With post-balancing the encoders are dealt separately and VL samples
//      are placed like text;
//      then local improvement of the ViT load (moves and swaps of VL samples
//      from the most loaded rank to the least loaded ones, never pushing a
//      rank's LLM load over its budget);
//   3. the other text documents, in batches onto the ranks with the lowest
//      LLM load: they fill every rank up to the mean, around what VL left;
//      then local improvement of the LLM load (moves and swaps of text and
//      VL samples from the most loaded rank, never raising the ViT maximum).
// Within a rank a text sample goes to the sequence with the most room (worst
// fit evens out micro-batches), a VL sample to the fullest sequence it fits
// (best fit keeps room for large samples); both respect seq_len and img_cap.
// Deterministic: ties go to the lower index.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/packer/core/packing.h"
#include "services/packer/core/rank_heap.h"

namespace tutti::packer {
namespace {

constexpr double kEps = 1e-12;
// A rank's LLM load is max(tokens / T*, kCostWeight * cost / C*). Tokens
// and cost cannot both be balanced when a few documents are far more
// cost-dense than the rest (a 32k-token document costs 5x per token at
// beta = 1/8192): ranks holding them run short of tokens and the others must
// take the surplus. The weight below settles that trade-off in favour of
// tokens (activation memory and the linear part of the cost follow tokens):
// cost is treated as balanced within 3% of its mean.
constexpr double kCostWeight = 0.97;
constexpr double kLargeText = 0.1;
// Weight of the VL-token dimension while placing VL samples: below 1 so the
// ViT cost leads and VL tokens only steer among ranks of similar ViT load.
constexpr double kVlTokenWeight = 0.8;
// Weight of the LLM load in a VL sample's placement: small, so it decides
// among ranks of equal ViT load.
constexpr double kLlmTieWeight = 0.02;
// Added to the score of a rank that a VL sample would push over its LLM
// budget: such ranks are used only when no other has room.
constexpr double kPenalty = 10;
// Receivers considered per heap by an improvement move.
constexpr uint32_t kReceivers = 4;
// Improvement stops once the maximum is within this of its lower bound:
// ViT, and LLM (where the last per-mille cost many small moves).
constexpr double kVitTolerance = 0.003;
constexpr double kLlmTolerance = 0.01;

// Token (and image-token) room of every sequence of one modality.
struct SeqRooms {
  uint32_t per_rank = 0;
  bool capped = false;
  bool best_fit = false;
  std::vector<uint32_t> room;
  std::vector<uint32_t> img_room;

  void Init(uint32_t ranks, uint32_t per, uint32_t seq_len, uint32_t img_cap, bool best) {
    per_rank = per;
    best_fit = best;
    capped = img_cap > 0;
    room.assign(size_t{ranks} * per, seq_len);
    img_room.assign(capped ? size_t{ranks} * per : 0, img_cap);
  }
  // The sequence of rank r the item goes to, -1 when none fits.
  int Pick(uint32_t r, uint32_t tokens, uint32_t img) const {
    int best = -1;
    const size_t base = size_t{r} * per_rank;
    for (uint32_t s = 0; s < per_rank; ++s) {
      if (room[base + s] < tokens || (capped && img_room[base + s] < img)) continue;
      if (best < 0 ||
          (best_fit ? room[base + s] < room[base + best] : room[base + s] > room[base + best])) {
        best = static_cast<int>(s);
      }
    }
    return best;
  }
  void Take(uint32_t slot, const PackItem& it) {
    room[slot] -= it.tokens;
    if (capped) img_room[slot] -= it.image_tokens;
  }
  void Give(uint32_t slot, const PackItem& it) {
    room[slot] += it.tokens;
    if (capped) img_room[slot] += it.image_tokens;
  }
};

using Lists = std::vector<std::vector<uint32_t>>;

struct State {
  // Per-rank loads.
  std::vector<double> vit, tokens, cost, vl_tokens, llm_key;
  // Heap keys: ViT load and VL tokens, +inf for a rank closed to VL samples
  // (so closed ranks never crowd the heads of the heaps); negated loads for
  // the max-heaps of the improvement phases.
  std::vector<double> vit_key, vt_key, neg_llm, neg_vit;
  RankHeap vit_heap, vt_heap, llm_heap, llm_max, vit_max;
  bool max_heaps = false;
  bool llm_heap_stale = false;  // llm_heap not maintained (rebuilt before use)
  SeqRooms text, vl;
  // (size << 32 | item) in placement order; VL items are n_text + i.
  std::vector<uint64_t> large, small, vl_order, tmp;
  Lists text_items, vl_items;  // per rank, for improvement moves
  std::vector<uint32_t> rank_order;
  std::vector<uint64_t> ranked;
};

// Stable LSD radix sort of 64-bit values by their upper 32 bits, descending.
void SortLargestFirst(std::vector<uint64_t>* v, std::vector<uint64_t>* tmp) {
  tmp->resize(v->size());
  uint32_t count[2048];
  for (int shift = 32; shift < 64; shift += 11) {
    std::fill(count, count + 2048, 0);
    for (uint64_t x : *v) ++count[2047 - ((x >> shift) & 2047)];
    uint32_t sum = 0;
    for (uint32_t& c : count) {
      const uint32_t n = c;
      c = sum;
      sum += n;
    }
    for (uint64_t x : *v) (*tmp)[count[2047 - ((x >> shift) & 2047)]++] = x;
    v->swap(*tmp);
  }
}

uint64_t Entry(double size, uint32_t i) {
  const double q = std::min(size * (1 << 20), 4294967295.0);  // 32-bit fixed point
  return (uint64_t(q) << 32) | i;
}

void BuildLists(uint32_t W, const std::vector<uint32_t>& slots, uint32_t per_rank, Lists* lists) {
  if (lists->size() < W) lists->resize(W);
  for (uint32_t r = 0; r < W; ++r) (*lists)[r].clear();
  for (uint32_t i = 0; i < slots.size(); ++i) (*lists)[slots[i] / per_rank].push_back(i);
}

void Erase(std::vector<uint32_t>* v, uint32_t x) {
  auto it = std::find(v->begin(), v->end(), x);
  if (it != v->end()) {
    *it = v->back();
    v->pop_back();
  }
}

class TuttiStrategy final : public PackingStrategy {
 public:
  explicit TuttiStrategy(uint32_t rounds) : rounds_(rounds) {}
  const std::string& name() const override { return name_; }

  absl::Status Pack(const PackProblem& p, PackResult* out) const override {
    thread_local State st;
    Means m;
    for (const PackItem& it : p.text) m.Add(it, false);
    for (const PackItem& it : p.vl) m.Add(it, p.balance_vit);
    m.Finish(p.ranks);
    Init(p, &st, out);
    return Run(p, m, &st, out);
  }

 private:
  struct Means {
    double vit = 0, tokens = 0, cost = 0, max_vit = 0, vl_tokens = 0, vl_llm = 0, vl_items = 0;
    // A rank within this of its LLM budget is closed to VL samples: twice
    // the mean VL sample's share of a rank's LLM load.
    double vl_margin = 0;
    void Add(const PackItem& it, bool with_vit) {
      tokens += it.tokens;
      cost += it.llm;
      if (!with_vit) return;
      vit += it.vit;
      vl_tokens += it.tokens;
      vl_llm += it.llm;
      vl_items += 1;
      max_vit = std::max(max_vit, it.vit);
    }
    void Finish(uint32_t W) {
      vit = std::max(vit / W, kEps);
      vl_tokens = std::max(vl_tokens / W, kEps);
      tokens = std::max(tokens / W, kEps);
      cost = std::max(cost / W, kEps);
      vl_margin = vl_items > 0 ? 2 * vl_llm / vl_items / cost : 0;
      inv_tokens = 1 / tokens;
      inv_cost = 1 / cost;
      inv_vit = 1 / vit;
      inv_vl_tokens = 1 / vl_tokens;
    }
    double inv_tokens = 1, inv_cost = 1, inv_vit = 1, inv_vl_tokens = 1;
    double Llm(double t, double c) const {
      return std::max(t * inv_tokens, c * inv_cost * kCostWeight);
    }
  };

  void Init(const PackProblem& p, State* st, PackResult* out) const {
    const uint32_t W = p.ranks;
    for (auto* v : {&st->vit, &st->tokens, &st->cost, &st->vl_tokens, &st->llm_key, &st->vit_key,
                    &st->vt_key, &st->neg_llm, &st->neg_vit}) {
      v->assign(W, 0.0);
    }
    st->text.Init(W, p.text_seqs_per_rank, p.seq_len, 0, /*best=*/false);
    st->vl.Init(W, p.vl_seqs_per_rank, p.seq_len, p.img_cap, /*best=*/true);
    st->vit_heap.Init(W, st->vit_key.data());
    st->vt_heap.Init(W, st->vt_key.data());
    st->llm_heap.Init(W, st->llm_key.data());
    st->max_heaps = false;
    out->text_slot.assign(p.text.size(), 0);
    out->vl_slot.assign(p.vl.size(), 0);
  }

  absl::Status Run(const PackProblem& p, const Means& m, State* st, PackResult* out) const {
    const uint32_t n_text = static_cast<uint32_t>(p.text.size());
    auto llm_size = [&](const PackItem& it) { return m.Llm(it.tokens, it.llm); };
    st->large.clear();
    st->small.clear();
    for (uint32_t i = 0; i < n_text; ++i) {
      const double size = llm_size(p.text[i]);
      (size >= kLargeText ? st->large : st->small).push_back(Entry(size, i));
    }
    st->vl_order.clear();
    for (uint32_t i = 0; i < p.vl.size(); ++i) {
      const PackItem& it = p.vl[i];
      const double size =
          p.balance_vit ? std::max(it.vit / m.vit, it.tokens / m.vl_tokens) : llm_size(it);
      st->vl_order.push_back(Entry(size, n_text + i));
    }
    for (auto* order : {&st->large, &st->small, &st->vl_order}) SortLargestFirst(order, &st->tmp);

    auto llm_candidates = [&](uint32_t width, uint32_t* cand) {
      return st->llm_heap.Smallest(width, cand);
    };
    auto llm_score = [&](uint32_t r, const PackItem& it) {
      return m.Llm(st->tokens[r] + it.tokens, st->cost[r] + it.llm);
    };
    // 1. Large text documents.
    absl::Status s = PlaceAll(p, m, st, out, st->large, false, 3, llm_candidates, llm_score);
    if (!s.ok()) return s;
    // 2. VL samples.
    if (p.balance_vit) {
      auto candidates = [&](uint32_t width, uint32_t* cand) {
        const uint32_t nc = st->vit_heap.Smallest(width, cand);
        return nc + st->vt_heap.Smallest(std::max(2u, width / 2), cand + nc);
      };
      auto score = [&](uint32_t r, const PackItem& it) {
        const double llm = llm_score(r, it);
        return std::max((st->vit[r] + it.vit) * m.inv_vit,
                        kVlTokenWeight * (st->vl_tokens[r] + it.tokens) * m.inv_vl_tokens) +
               kLlmTieWeight * llm + (llm > 1 ? kPenalty + llm : 0.0);
      };
      // The LLM heap is not consulted while VL samples are placed: rebuilt
      // once afterwards instead of updated per sample.
      st->llm_heap_stale = true;
      s = PlaceAll(p, m, st, out, st->vl_order, true, 3, candidates, score);
      st->llm_heap_stale = false;
      if (!s.ok()) return s;
      st->llm_heap.Init(p.ranks, st->llm_key.data());
      ImproveVit(p, m, st, out);
    } else {
      // Post-balancing: VL samples balance the LLM load only; the ranks with
      // the most VL room are candidates too, so VL sequences fill alike.
      auto candidates = [&](uint32_t width, uint32_t* cand) {
        const uint32_t nc = st->llm_heap.Smallest(width, cand);
        return nc + st->vt_heap.Smallest(std::max(2u, width / 2), cand + nc);
      };
      s = PlaceAll(p, m, st, out, st->vl_order, true, 3, candidates, llm_score);
      if (!s.ok()) return s;
    }
    // 3. The other text documents.
    s = PlaceSmall(p, m, st, out);
    if (!s.ok()) return s;
    ImproveLlm(p, m, st, out);
    return absl::OkStatus();
  }

  // Recomputes rank r's derived keys and repositions it in the heaps
  // (`vl`: its ViT load or VL tokens may have changed).
  static void Touch(const PackProblem& p, const Means& m, State* st, uint32_t r, bool vl) {
    st->llm_key[r] = m.Llm(st->tokens[r], st->cost[r]);
    if (!st->llm_heap_stale) st->llm_heap.Update(r);
    if (p.balance_vit) {
      const bool closed = st->llm_key[r] >= 1 - m.vl_margin;
      const double vit_key = closed ? HUGE_VAL : st->vit[r];
      if (vl || vit_key != st->vit_key[r]) {
        st->vit_key[r] = vit_key;
        st->vt_key[r] = closed ? HUGE_VAL : st->vl_tokens[r];
        st->vit_heap.Update(r);
        st->vt_heap.Update(r);
      }
    } else if (vl) {
      st->vt_key[r] = st->vl_tokens[r];
      st->vt_heap.Update(r);
    }
    if (st->max_heaps) {
      st->neg_llm[r] = -st->llm_key[r];
      st->neg_vit[r] = -st->vit[r];
      st->llm_max.Update(r);
      st->vit_max.Update(r);
    }
  }

  static void Apply(const PackProblem& p, State* st, uint32_t r, const PackItem& it, int sign,
                    bool vl) {
    st->tokens[r] += sign * double(it.tokens);
    st->cost[r] += sign * it.llm;
    if (vl) st->vl_tokens[r] += sign * double(it.tokens);
    if (vl && p.balance_vit) st->vit[r] += sign * it.vit;
  }

  void StartMaxHeaps(uint32_t W, State* st) const {
    for (uint32_t r = 0; r < W; ++r) {
      st->neg_llm[r] = -st->llm_key[r];
      st->neg_vit[r] = -st->vit[r];
    }
    st->llm_max.Init(W, st->neg_llm.data());
    st->vit_max.Init(W, st->neg_vit.data());
    st->max_heaps = true;
  }

  // Places the items of `order` one by one. `candidates(width, cand)` lists
  // about `width` ranks per heap (first `first_width`, then 16);
  // `score(r, item)` rates a rank, lower is better, kPenalty or more meaning
  // last resort. Falls back to every rank when no candidate has room.
  template <typename Candidates, typename Score>
  absl::Status PlaceAll(const PackProblem& p, const Means& m, State* st, PackResult* out,
                        const std::vector<uint64_t>& order, bool vl, uint32_t first_width,
                        Candidates candidates, Score score) const {
    const uint32_t W = p.ranks;
    SeqRooms& rooms = vl ? st->vl : st->text;
    const uint32_t offset = vl ? static_cast<uint32_t>(p.text.size()) : 0;
    const PackItem* base = vl ? p.vl.data() : p.text.data();
    uint32_t* slots = vl ? out->vl_slot.data() : out->text_slot.data();
    uint32_t cand[64];
    for (size_t k = 0; k < order.size(); ++k) {
      // Items come in size order, i.e. from random places: fetch ahead.
      if (k + 8 < order.size()) __builtin_prefetch(base + (uint32_t(order[k + 8]) - offset));
      const uint32_t i = static_cast<uint32_t>(order[k]) - offset;
      const PackItem& it = base[i];
      int best_r = -1, best_s = -1;
      double best = 0;
      auto consider = [&](uint32_t r) {
        const int s = rooms.Pick(r, it.tokens, it.image_tokens);
        if (s < 0) return;
        const double v = score(r, it);
        if (best_r < 0 || v < best || (v == best && static_cast<int>(r) < best_r)) {
          best = v;
          best_r = static_cast<int>(r);
          best_s = s;
        }
      };
      for (uint32_t width : {first_width, 16u}) {
        const uint32_t nc = candidates(width, cand);
        for (uint32_t c = 0; c < nc; ++c) consider(cand[c]);
        if (best_r >= 0 && best < kPenalty) break;
      }
      if (best_r < 0 || best >= kPenalty) {
        for (uint32_t r = 0; r < W; ++r) consider(r);
      }
      if (best_r < 0) {
        uint64_t total = 0;
        for (const PackItem& x : vl ? p.vl : p.text) total += x.tokens;
        return CapacityError(
            vl ? "VL" : "text", total, W, rooms.per_rank, p.seq_len,
            absl::StrCat("no sequence has room left for a sample of ", it.tokens, " tokens"));
      }
      const uint32_t r = static_cast<uint32_t>(best_r);
      slots[i] = r * rooms.per_rank + static_cast<uint32_t>(best_s);
      rooms.Take(slots[i], it);
      Apply(p, st, r, it, +1, vl);
      Touch(p, m, st, r, vl);
    }
    return absl::OkStatus();
  }

  // Places the small text documents, largest first, in batches: the B
  // largest go to the B ranks with the lowest LLM load (largest to lowest),
  // then loads are re-ranked. The same result as one-at-a-time
  // least-loaded placement up to the order within a batch, without a heap
  // operation per document (small documents are most of a step).
  absl::Status PlaceSmall(const PackProblem& p, const Means& m, State* st, PackResult* out) const {
    const uint32_t W = p.ranks;
    const uint32_t B = std::max(1u, W / 4);
    std::vector<uint32_t>& ranks = st->rank_order;
    ranks.resize(W);
    const std::vector<uint64_t>& order = st->small;
    for (size_t k0 = 0; k0 < order.size(); k0 += B) {
      const size_t n = std::min<size_t>(B, order.size() - k0);
      // Ranks are ranked by the LLM load they would have after taking the
      // batch's mean document: a batch of long (cost-dense) documents goes
      // to ranks with cost to spare, one of short documents to ranks with
      // tokens to spare, so the two budgets fill together.
      double t_mean = 0, c_mean = 0;
      for (size_t k = 0; k < n; ++k) {
        const PackItem& it = p.text[uint32_t(order[k0 + k])];
        t_mean += it.tokens;
        c_mean += it.llm;
      }
      t_mean /= n;
      c_mean /= n;
      // A rank whose text sequences cannot take even the batch's smallest
      // document is out of the running.
      const uint32_t t_min = p.text[uint32_t(order[k0 + n - 1])].tokens;
      // (load after the mean document as float bits << 32 | rank): ordered
      // by load, ties by rank, compared without indirection.
      std::vector<uint64_t>& ranked = st->ranked;
      ranked.resize(W);
      const uint32_t per = st->text.per_rank;
      for (uint32_t r = 0; r < W; ++r) {
        uint32_t room = 0;
        for (uint32_t q = 0; q < per; ++q) room = std::max(room, st->text.room[r * per + q]);
        const float after =
            room < t_min ? HUGE_VALF
                         : static_cast<float>(m.Llm(st->tokens[r] + t_mean, st->cost[r] + c_mean));
        uint32_t bits;
        std::memcpy(&bits, &after, 4);  // non-negative floats order like their bits
        ranked[r] = (uint64_t{bits} << 32) | r;
      }
      if (n < W) std::nth_element(ranked.begin(), ranked.begin() + n, ranked.end());
      std::sort(ranked.begin(), ranked.begin() + n);
      for (size_t k = 0; k < n; ++k) ranks[k] = static_cast<uint32_t>(ranked[k]);
      for (size_t k = 0; k < n; ++k) {
        if (k + 8 < n) __builtin_prefetch(p.text.data() + uint32_t(order[k0 + k + 8]));
        const uint32_t i = static_cast<uint32_t>(order[k0 + k]);
        const PackItem& it = p.text[i];
        uint32_t r = ranks[k];
        int seq = st->text.Pick(r, it.tokens, 0);
        if (seq < 0) {  // full: the least-loaded rank with room
          double best = 0;
          for (uint32_t q = 0; q < W; ++q) {
            const int sq = st->text.Pick(q, it.tokens, 0);
            if (sq >= 0 && (seq < 0 || st->llm_key[q] < best))
              seq = sq, r = q, best = st->llm_key[q];
          }
          if (seq < 0) {
            uint64_t total = 0;
            for (const PackItem& x : p.text) total += x.tokens;
            return CapacityError(
                "text", total, W, st->text.per_rank, p.seq_len,
                absl::StrCat("no sequence has room left for a sample of ", it.tokens, " tokens"));
          }
        }
        out->text_slot[i] = r * st->text.per_rank + static_cast<uint32_t>(seq);
        st->text.Take(out->text_slot[i], it);
        Apply(p, st, r, it, +1, false);
        st->llm_key[r] = m.Llm(st->tokens[r], st->cost[r]);
      }
    }
    // Heaps and keys as if placed one by one.
    for (uint32_t r = 0; r < W; ++r) {
      if (p.balance_vit && st->llm_key[r] >= 1 - m.vl_margin)
        st->vit_key[r] = st->vt_key[r] = HUGE_VAL;
    }
    st->llm_heap.Init(W, st->llm_key.data());
    st->vit_heap.Init(W, st->vit_key.data());
    st->vt_heap.Init(W, st->vt_key.data());
    return absl::OkStatus();
  }

  // Moves item i from rank `from` to `to`, or swaps it with item j of `to`,
  // when the sequences have room. Updates loads, lists and heaps.
  bool Exchange(const PackProblem& p, const Means& m, State* st, PackResult* out, bool vl,
                uint32_t from, uint32_t to, int i, int j) const {
    SeqRooms& rooms = vl ? st->vl : st->text;
    std::vector<uint32_t>& slots = vl ? out->vl_slot : out->text_slot;
    const absl::Span<const PackItem> items = vl ? p.vl : p.text;
    Lists& lists = vl ? st->vl_items : st->text_items;
    const PackItem& a = items[i];
    const uint32_t per = rooms.per_rank;
    if (j < 0) {
      const int s = rooms.Pick(to, a.tokens, a.image_tokens);
      if (s < 0) return false;
      rooms.Give(slots[i], a);
      slots[i] = to * per + static_cast<uint32_t>(s);
      rooms.Take(slots[i], a);
    } else {
      const PackItem& b = items[j];
      rooms.Give(slots[i], a);
      rooms.Give(slots[j], b);
      const int sb = rooms.Pick(from, b.tokens, b.image_tokens);
      if (sb >= 0) rooms.Take(from * per + sb, b);
      const int sa = sb >= 0 ? rooms.Pick(to, a.tokens, a.image_tokens) : -1;
      if (sa < 0) {
        if (sb >= 0) rooms.Give(from * per + sb, b);
        rooms.Take(slots[i], a);
        rooms.Take(slots[j], b);
        return false;
      }
      slots[j] = from * per + static_cast<uint32_t>(sb);
      slots[i] = to * per + static_cast<uint32_t>(sa);
      rooms.Take(slots[i], a);
      Apply(p, st, to, b, -1, vl);
      Apply(p, st, from, b, +1, vl);
      Erase(&lists[to], j);
      lists[from].push_back(j);
    }
    Apply(p, st, from, a, -1, vl);
    Apply(p, st, to, a, +1, vl);
    Erase(&lists[from], i);
    lists[to].push_back(i);
    Touch(p, m, st, from, vl);
    Touch(p, m, st, to, vl);
    return true;
  }

  // The best move (j < 0) or swap of an item of `hi` with `lo`, by `gain`
  // (the resulting maximum, lower is better; NaN when not allowed).
  struct Move {
    double value;
    int i = -1, j = -1;
    uint32_t to = 0;
    bool vl = false;
  };
  template <typename Value>
  static void BestMove(const std::vector<uint32_t>& from_items, absl::Span<const PackItem> items,
                       const SeqRooms& rooms, uint32_t lo, bool vl, Value value, Move* best) {
    for (uint32_t i : from_items) {
      const PackItem& a = items[i];
      const double v = value(a, nullptr);
      if (v < best->value && rooms.Pick(lo, a.tokens, a.image_tokens) >= 0) {
        *best = Move{v, static_cast<int>(i), -1, lo, vl};
      }
    }
  }

  // The best swap of an item a of `hi` with an item b of `lo`. The best
  // partner moves about half the gap between the two ranks, so instead of
  // every pair only the partners around key(b) = key(a) - gap / 2 are tried,
  // for each of up to two keys that order the items alike (tokens and cost
  // are both increasing in a document's length): O(n log n), not O(n^2).
  template <typename Key1, typename Key2, typename Value>
  static void BestSwap(const std::vector<uint32_t>& from_items,
                       const std::vector<uint32_t>& to_items, absl::Span<const PackItem> items,
                       uint32_t lo, bool vl, Key1 key1, double gap1, Key2 key2, double gap2,
                       Value value, Move* best) {
    thread_local std::vector<std::pair<double, uint32_t>> sorted;
    sorted.clear();
    for (uint32_t j : to_items) sorted.emplace_back(key1(items[j]), j);
    std::sort(sorted.begin(), sorted.end());
    auto try_around = [&](const PackItem& a, uint32_t i, size_t pos) {
      for (size_t q = pos > 1 ? pos - 2 : 0; q < std::min(sorted.size(), pos + 2); ++q) {
        const uint32_t j = sorted[q].second;
        const double v = value(a, &items[j]);
        if (v < best->value) *best = Move{v, static_cast<int>(i), static_cast<int>(j), lo, vl};
      }
    };
    for (uint32_t i : from_items) {
      const PackItem& a = items[i];
      const double want1 = key1(a) - gap1 / 2;
      try_around(a, i,
                 std::lower_bound(sorted.begin(), sorted.end(), std::make_pair(want1, 0u)) -
                     sorted.begin());
      if (gap2 > 0) {
        const double want2 = key2(a) - gap2 / 2;
        const size_t pos =
            std::partition_point(sorted.begin(), sorted.end(),
                                 [&](const auto& e) { return key2(items[e.second]) < want2; }) -
            sorted.begin();
        try_around(a, i, pos);
      }
    }
  }

  // Lowers the largest ViT load: moves and swaps of VL samples from the
  // most loaded rank to the least loaded ones (by ViT and by LLM), never
  // pushing a rank's LLM load (large documents + VL) over its budget.
  void ImproveVit(const PackProblem& p, const Means& m, State* st, PackResult* out) const {
    const uint32_t W = p.ranks;
    if (p.vl.empty() || W < 2) return;
    BuildLists(W, out->vl_slot, p.vl_seqs_per_rank, &st->vl_items);
    StartMaxHeaps(W, st);
    const double lb = std::max(m.vit, m.max_vit);
    uint32_t receivers[2 * kReceivers];
    for (uint32_t round = 0; round < Rounds(W); ++round) {
      const uint32_t hi = st->vit_max.Top();
      if (st->vit[hi] <= lb * (1 + kVitTolerance)) break;
      uint32_t nr = st->vit_heap.Smallest(kReceivers, receivers);
      nr += st->llm_heap.Smallest(kReceivers, receivers + nr);
      Move best{st->vit[hi] * (1 - 1e-9)};
      for (bool swaps : {false, true}) {
        for (uint32_t k = 0; k < nr; ++k) {
          const uint32_t lo = receivers[k];
          if (lo == hi) continue;
          auto llm_ok = [&](uint32_t r, double dt, double dc) {
            return m.Llm(st->tokens[r] + dt, st->cost[r] + dc) <= std::max(1.0, st->llm_key[r]);
          };
          auto value = [&](const PackItem& a, const PackItem* b) {
            const double dv = a.vit - (b ? b->vit : 0);
            const double dt = double(a.tokens) - (b ? b->tokens : 0);
            const double dc = a.llm - (b ? b->llm : 0);
            if (dv <= 0 || !llm_ok(lo, dt, dc) || !llm_ok(hi, -dt, -dc)) return HUGE_VAL;
            return std::max(st->vit[hi] - dv, st->vit[lo] + dv);
          };
          if (!swaps) {
            BestMove(st->vl_items[hi], p.vl, st->vl, lo, true, value, &best);
          } else {
            auto vit_of = [](const PackItem& x) { return x.vit; };
            BestSwap(st->vl_items[hi], st->vl_items[lo], p.vl, lo, true, vit_of,
                     st->vit[hi] - st->vit[lo], vit_of, 0.0, value, &best);
          }
        }
        if (best.i >= 0) break;
      }
      if (best.i < 0 || !Exchange(p, m, st, out, true, hi, best.to, best.i, best.j)) break;
    }
    st->max_heaps = false;
  }

  // Lowers the largest LLM load: moves and swaps of text samples (and of
  // VL samples, when no ViT load rises above the current maximum) from the
  // most loaded rank to the least loaded ones.
  void ImproveLlm(const PackProblem& p, const Means& m, State* st, PackResult* out) const {
    const uint32_t W = p.ranks;
    if (W < 2) return;
    BuildLists(W, out->text_slot, std::max(1u, p.text_seqs_per_rank), &st->text_items);
    BuildLists(W, out->vl_slot, std::max(1u, p.vl_seqs_per_rank), &st->vl_items);
    StartMaxHeaps(W, st);
    double vit_max = 0;
    for (uint32_t r = 0; r < W; ++r) vit_max = std::max(vit_max, st->vit[r]);
    double lb = 1;  // max(mean, largest single item), in units of the mean
    for (const PackItem& it : p.text) lb = std::max(lb, m.Llm(it.tokens, it.llm));
    for (const PackItem& it : p.vl) lb = std::max(lb, m.Llm(it.tokens, it.llm));
    uint32_t receivers[2 * kReceivers];
    for (uint32_t round = 0; round < Rounds(W); ++round) {
      const uint32_t hi = st->llm_max.Top();
      if (st->llm_key[hi] <= lb * (1 + kLlmTolerance)) break;
      uint32_t nr = st->llm_heap.Smallest(kReceivers, receivers);
      const uint32_t n_llm = nr;
      if (p.balance_vit) nr += st->vit_heap.Smallest(kReceivers, receivers + nr);
      Move best{st->llm_key[hi] * (1 - 1e-9)};
      for (bool swaps : {false, true}) {
        for (uint32_t k = 0; k < nr; ++k) {
          const uint32_t lo = receivers[k];
          if (lo == hi) continue;
          auto value_for = [&](bool vl) {
            return [&, vl](const PackItem& a, const PackItem* b) {
              const double dt = double(a.tokens) - (b ? b->tokens : 0);
              const double dc = a.llm - (b ? b->llm : 0);
              const double dv = a.vit - (b ? b->vit : 0);
              if (dt <= 0 && dc <= 0) return HUGE_VAL;
              if (vl && p.balance_vit &&
                  (st->vit[lo] + dv > vit_max || st->vit[hi] - dv > vit_max)) {
                return HUGE_VAL;
              }
              return std::max(m.Llm(st->tokens[hi] - dt, st->cost[hi] - dc),
                              m.Llm(st->tokens[lo] + dt, st->cost[lo] + dc));
            };
          };
          // Text with the LLM receivers (swaps with the least loaded only),
          // VL with all receivers.
          auto tokens_of = [](const PackItem& x) { return double(x.tokens); };
          auto cost_of = [](const PackItem& x) { return x.llm; };
          const double gap_t = st->tokens[hi] - st->tokens[lo];
          const double gap_c = st->cost[hi] - st->cost[lo];
          if (k < n_llm && (!swaps || k == 0)) {
            if (!swaps) {
              BestMove(st->text_items[hi], p.text, st->text, lo, false, value_for(false), &best);
            } else {
              BestSwap(st->text_items[hi], st->text_items[lo], p.text, lo, false, tokens_of, gap_t,
                       cost_of, gap_c, value_for(false), &best);
            }
          }
          if (!swaps || k == 0 || k == n_llm) {
            if (!swaps) {
              BestMove(st->vl_items[hi], p.vl, st->vl, lo, true, value_for(true), &best);
            } else {
              BestSwap(st->vl_items[hi], st->vl_items[lo], p.vl, lo, true, tokens_of, gap_t,
                       cost_of, gap_c, value_for(true), &best);
            }
          }
        }
        if (best.i >= 0) break;
      }
      if (best.i < 0 || !Exchange(p, m, st, out, best.vl, hi, best.to, best.i, best.j)) break;
    }
    st->max_heaps = false;
  }

  // Improvement moves allowed: `improvement_rounds` per 64 ranks.
  uint32_t Rounds(uint32_t W) const { return rounds_ * std::max(1u, (W + 63) / 64); }

  const std::string name_ = "tutti";
  uint32_t rounds_;
};

}  // namespace

std::unique_ptr<PackingStrategy> MakeTuttiStrategy(uint32_t improvement_rounds) {
  return std::make_unique<TuttiStrategy>(improvement_rounds);
}

}  // namespace tutti::packer
