// The "tutti" strategy: balances the ViT cost and the LLM cost and tokens of
// every rank at once.
//
//  1. VL samples, largest first (by the larger of their ViT cost share and
//     token share), each to the candidate rank that minimises the resulting
//     max(ViT load / mean, w * VL tokens / mean) - with post-balancing, where
//     the encoders are dealt separately, max(LLM tokens, LLM cost) instead.
//     Candidates are the few least-loaded ranks of indexed heaps, so a
//     placement costs O(log W).
//  2. Local improvement: moves and swaps of VL samples between the most and
//     the least ViT-loaded ranks while they lower the maximum.
//  3. Text samples, longest first, each to the candidate rank that minimises
//     the resulting max(LLM tokens / mean, LLM cost / mean) over both
//     modalities, so text fills up the ranks whose VL share is light.
//  4. Local improvement of the LLM phase with moves and swaps of text samples.
// Within a rank a sample goes to the sequence with the most room that fits
// it (tokens <= seq_len, image tokens <= img_cap). Everything is
// deterministic (ties go to the lower index).
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/packer/packing.h"
#include "services/packer/rank_heap.h"

namespace tutti::packer {
namespace {

// Weight of the VL-token dimension while placing VL samples: below 1 so the
// ViT cost leads and tokens only steer among ranks of similar ViT load.
constexpr double kVlTokenWeight = 0.8;
constexpr double kEps = 1e-9;

// Token (and image-token) room of every sequence of one modality.
struct SeqRooms {
  uint32_t per_rank = 0;
  bool capped = false;
  std::vector<uint32_t> room;
  std::vector<uint32_t> img_room;

  void Init(uint32_t ranks, uint32_t per, uint32_t seq_len, uint32_t img_cap) {
    per_rank = per;
    capped = img_cap > 0;
    room.assign(size_t{ranks} * per, seq_len);
    img_room.assign(capped ? size_t{ranks} * per : 0, img_cap);
  }
  // The sequence of rank r with the most room that fits; -1 when none does.
  int Pick(uint32_t r, uint32_t tokens, uint32_t img) const {
    int best = -1;
    const size_t base = size_t{r} * per_rank;
    for (uint32_t s = 0; s < per_rank; ++s) {
      if (room[base + s] < tokens) continue;
      if (capped && img_room[base + s] < img) continue;
      if (best < 0 || room[base + s] > room[base + best]) best = static_cast<int>(s);
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

struct State {
  std::vector<double> vit, tokens, cost, vl_tokens;
  SeqRooms text, vl;
  RankHeap heap_a, heap_b;
  std::vector<std::pair<double, uint32_t>> order;
  std::vector<std::vector<uint32_t>> items;  // per rank, for improvement moves
};

class TuttiStrategy final : public PackingStrategy {
 public:
  explicit TuttiStrategy(uint32_t rounds) : rounds_(rounds) {}
  const std::string& name() const override { return name_; }

  absl::Status Pack(const PackProblem& p, PackResult* out) const override {
    thread_local State st;
    const uint32_t W = p.ranks;
    st.vit.assign(W, 0.0);
    st.tokens.assign(W, 0.0);
    st.cost.assign(W, 0.0);
    st.vl_tokens.assign(W, 0.0);
    st.text.Init(W, p.text_seqs_per_rank, p.seq_len, 0);
    st.vl.Init(W, p.vl_seqs_per_rank, p.seq_len, p.img_cap);
    out->text_slot.assign(p.text.size(), 0);
    out->vl_slot.assign(p.vl.size(), 0);

    Totals t;
    for (const PackItem& it : p.text) t.Add(it, false);
    for (const PackItem& it : p.vl) t.Add(it, p.balance_vit);
    t.Finish(W);

    if (absl::Status s = PlaceVl(p, t, &st, out); !s.ok()) return s;
    if (p.balance_vit) ImproveVit(p, t, &st, out);
    if (absl::Status s = PlaceText(p, t, &st, out); !s.ok()) return s;
    ImproveLlm(p, t, &st, out);
    return absl::OkStatus();
  }

 private:
  struct Totals {
    double vit = 0, tokens = 0, cost = 0, vl_tokens = 0, max_vit = 0;
    uint64_t text_tokens = 0, vl_tokens_int = 0;
    void Add(const PackItem& it, bool vl_balanced) {
      tokens += it.tokens;
      cost += it.llm;
      if (vl_balanced) {
        vit += it.vit;
        vl_tokens += it.tokens;
        max_vit = std::max(max_vit, it.vit);
      }
    }
    void Finish(uint32_t W) {
      vit = std::max(vit / W, kEps);
      tokens = std::max(tokens / W, kEps);
      cost = std::max(cost / W, kEps);
      vl_tokens = std::max(vl_tokens / W, kEps);
    }
  };

  // Generic largest-first placement of one modality's items.
  template <typename Score>
  absl::Status Place(const PackProblem& p, absl::Span<const PackItem> items, SeqRooms* rooms,
                     State* st, RankHeap* ha, RankHeap* hb, const double* ka, const double* kb,
                     Score score, uint32_t* slot_out, absl::string_view modality) const {
    const uint32_t W = p.ranks;
    uint32_t cand[40];
    for (const auto& [key, idx] : st->order) {
      const PackItem& it = items[idx];
      int best_r = -1, best_s = -1;
      double best = 0;
      auto consider = [&](uint32_t r) {
        const int s = rooms->Pick(r, it.tokens, it.image_tokens);
        if (s < 0) return;
        const double v = score(r, it);
        if (best_r < 0 || v < best || (v == best && static_cast<int>(r) < best_r)) {
          best = v;
          best_r = static_cast<int>(r);
          best_s = s;
        }
      };
      uint32_t n = ha->Smallest(3, cand);
      n += hb->Smallest(2, cand + n);
      for (uint32_t c = 0; c < n; ++c) consider(cand[c]);
      if (best_r < 0) {
        n = ha->Smallest(16, cand);
        n += hb->Smallest(16, cand + n);
        for (uint32_t c = 0; c < n; ++c) consider(cand[c]);
      }
      if (best_r < 0) {
        for (uint32_t r = 0; r < W; ++r) consider(r);
      }
      if (best_r < 0) {
        uint64_t total = 0;
        for (const PackItem& x : items) total += x.tokens;
        return CapacityError(
            modality, total, W, rooms->per_rank, p.seq_len,
            absl::StrCat("no sequence has room for a sample of ", it.tokens, " tokens"));
      }
      const uint32_t r = static_cast<uint32_t>(best_r);
      const uint32_t slot = r * rooms->per_rank + static_cast<uint32_t>(best_s);
      slot_out[idx] = slot;
      rooms->Take(slot, it);
      Apply(st, r, it, +1, modality == "VL" && p.balance_vit);
      ha->Update(r);
      hb->Update(r);
      (void)ka;
      (void)kb;
    }
    return absl::OkStatus();
  }

  static void Apply(State* st, uint32_t r, const PackItem& it, int sign, bool vl_balanced) {
    st->tokens[r] += sign * double(it.tokens);
    st->cost[r] += sign * it.llm;
    if (vl_balanced) {
      st->vit[r] += sign * it.vit;
      st->vl_tokens[r] += sign * double(it.tokens);
    }
  }

  absl::Status PlaceVl(const PackProblem& p, const Totals& t, State* st, PackResult* out) const {
    if (p.vl.empty()) return absl::OkStatus();
    st->order.clear();
    for (uint32_t i = 0; i < p.vl.size(); ++i) {
      const PackItem& it = p.vl[i];
      const double size = p.balance_vit ? std::max(it.vit / t.vit, it.tokens / double(p.seq_len))
                                        : std::max(it.llm / t.cost, it.tokens / t.tokens);
      st->order.emplace_back(-size, i);
    }
    std::sort(st->order.begin(), st->order.end());
    if (p.balance_vit) {
      st->heap_a.Init(p.ranks, st->vit.data());
      st->heap_b.Init(p.ranks, st->vl_tokens.data());
      auto score = [&](uint32_t r, const PackItem& it) {
        return std::max((st->vit[r] + it.vit) / t.vit,
                        kVlTokenWeight * (st->vl_tokens[r] + it.tokens) / t.vl_tokens);
      };
      return Place(p, p.vl, &st->vl, st, &st->heap_a, &st->heap_b, st->vit.data(),
                   st->vl_tokens.data(), score, out->vl_slot.data(), "VL");
    }
    st->heap_a.Init(p.ranks, st->tokens.data());
    st->heap_b.Init(p.ranks, st->cost.data());
    auto score = [&](uint32_t r, const PackItem& it) {
      return std::max((st->tokens[r] + it.tokens) / t.tokens, (st->cost[r] + it.llm) / t.cost);
    };
    return Place(p, p.vl, &st->vl, st, &st->heap_a, &st->heap_b, st->tokens.data(), st->cost.data(),
                 score, out->vl_slot.data(), "VL");
  }

  absl::Status PlaceText(const PackProblem& p, const Totals& t, State* st, PackResult* out) const {
    if (p.text.empty()) return absl::OkStatus();
    st->order.clear();
    for (uint32_t i = 0; i < p.text.size(); ++i) {
      st->order.emplace_back(-double(p.text[i].tokens), i);
    }
    std::sort(st->order.begin(), st->order.end());
    st->heap_a.Init(p.ranks, st->tokens.data());
    st->heap_b.Init(p.ranks, st->cost.data());
    auto score = [&](uint32_t r, const PackItem& it) {
      return std::max((st->tokens[r] + it.tokens) / t.tokens, (st->cost[r] + it.llm) / t.cost);
    };
    return Place(p, p.text, &st->text, st, &st->heap_a, &st->heap_b, st->tokens.data(),
                 st->cost.data(), score, out->text_slot.data(), "text");
  }

  // Tries to move item i from its slot to a sequence of rank `to`; on
  // success updates rooms and slot.
  static bool TryMove(SeqRooms* rooms, uint32_t* slot, const PackItem& it, uint32_t to) {
    const int s = rooms->Pick(to, it.tokens, it.image_tokens);
    if (s < 0) return false;
    rooms->Give(*slot, it);
    *slot = to * rooms->per_rank + static_cast<uint32_t>(s);
    rooms->Take(*slot, it);
    return true;
  }

  // Swaps items i (on rank a) and j (on rank b) if both fit after the swap.
  static bool TrySwap(SeqRooms* rooms, uint32_t* slot_i, const PackItem& i, uint32_t* slot_j,
                      const PackItem& j) {
    const uint32_t a = *slot_i / rooms->per_rank, b = *slot_j / rooms->per_rank;
    rooms->Give(*slot_i, i);
    rooms->Give(*slot_j, j);
    const int sj = rooms->Pick(a, j.tokens, j.image_tokens);
    if (sj >= 0) {
      rooms->Take(a * rooms->per_rank + sj, j);
      const int si = rooms->Pick(b, i.tokens, i.image_tokens);
      if (si >= 0) {
        *slot_j = a * rooms->per_rank + sj;
        *slot_i = b * rooms->per_rank + si;
        rooms->Take(*slot_i, i);
        return true;
      }
      rooms->Give(a * rooms->per_rank + sj, j);
    }
    rooms->Take(*slot_i, i);
    rooms->Take(*slot_j, j);
    return false;
  }

  void BuildLists(uint32_t W, const std::vector<uint32_t>& slots, uint32_t per_rank,
                  State* st) const {
    if (st->items.size() < W) st->items.resize(W);
    for (uint32_t r = 0; r < W; ++r) st->items[r].clear();
    for (uint32_t i = 0; i < slots.size(); ++i) st->items[slots[i] / per_rank].push_back(i);
  }

  static void Erase(std::vector<uint32_t>* v, uint32_t x) {
    auto it = std::find(v->begin(), v->end(), x);
    if (it != v->end()) {
      *it = v->back();
      v->pop_back();
    }
  }

  // Moves/swaps VL items between the most and least ViT-loaded ranks.
  void ImproveVit(const PackProblem& p, const Totals& t, State* st, PackResult* out) const {
    const uint32_t W = p.ranks;
    if (p.vl.empty() || W < 2) return;
    BuildLists(W, out->vl_slot, p.vl_seqs_per_rank, st);
    const double lb = std::max(t.vit, t.max_vit);
    for (uint32_t round = 0; round < rounds_; ++round) {
      uint32_t m = 0, n = 0;
      for (uint32_t r = 1; r < W; ++r) {
        if (st->vit[r] > st->vit[m]) m = r;
        if (st->vit[r] < st->vit[n]) n = r;
      }
      if (st->vit[m] <= lb * (1 + 1e-6)) return;
      double best = st->vit[m] * (1 - 1e-9);
      int bi = -1, bj = -1;
      for (uint32_t i : st->items[m]) {
        const double vi = p.vl[i].vit;
        if (std::max(st->vit[m] - vi, st->vit[n] + vi) < best &&
            st->vl.Pick(n, p.vl[i].tokens, p.vl[i].image_tokens) >= 0) {
          best = std::max(st->vit[m] - vi, st->vit[n] + vi);
          bi = static_cast<int>(i);
          bj = -1;
        }
        for (uint32_t j : st->items[n]) {
          const double d = vi - p.vl[j].vit;
          if (d <= 0) continue;
          const double v = std::max(st->vit[m] - d, st->vit[n] + d);
          if (v < best) {
            best = v;
            bi = static_cast<int>(i);
            bj = static_cast<int>(j);
          }
        }
      }
      if (bi < 0) return;
      const PackItem& a = p.vl[bi];
      if (bj < 0) {
        if (!TryMove(&st->vl, &out->vl_slot[bi], a, n)) return;
        Apply(st, m, a, -1, true);
        Apply(st, n, a, +1, true);
        Erase(&st->items[m], bi);
        st->items[n].push_back(bi);
      } else {
        const PackItem& b = p.vl[bj];
        if (!TrySwap(&st->vl, &out->vl_slot[bi], a, &out->vl_slot[bj], b)) return;
        Apply(st, m, a, -1, true);
        Apply(st, n, a, +1, true);
        Apply(st, n, b, -1, true);
        Apply(st, m, b, +1, true);
        Erase(&st->items[m], bi);
        Erase(&st->items[n], bj);
        st->items[n].push_back(bi);
        st->items[m].push_back(bj);
      }
    }
  }

  // Moves/swaps text items between the ranks with the highest and lowest
  // max(tokens / mean, cost / mean).
  void ImproveLlm(const PackProblem& p, const Totals& t, State* st, PackResult* out) const {
    const uint32_t W = p.ranks;
    if (p.text.empty() || W < 2) return;
    BuildLists(W, out->text_slot, p.text_seqs_per_rank, st);
    auto score = [&](double tok, double cost) { return std::max(tok / t.tokens, cost / t.cost); };
    for (uint32_t round = 0; round < rounds_; ++round) {
      uint32_t m = 0, n = 0;
      double sm = -1, sn = 1e300;
      for (uint32_t r = 0; r < W; ++r) {
        const double s = score(st->tokens[r], st->cost[r]);
        if (s > sm) sm = s, m = r;
        if (s < sn) sn = s, n = r;
      }
      if (m == n) return;
      double best = sm * (1 - 1e-9);
      int bi = -1, bj = -1;
      for (uint32_t i : st->items[m]) {
        const PackItem& a = p.text[i];
        const double v = std::max(score(st->tokens[m] - a.tokens, st->cost[m] - a.llm),
                                  score(st->tokens[n] + a.tokens, st->cost[n] + a.llm));
        if (v < best && st->text.Pick(n, a.tokens, 0) >= 0) {
          best = v;
          bi = static_cast<int>(i);
          bj = -1;
        }
        for (uint32_t j : st->items[n]) {
          const PackItem& b = p.text[j];
          const double dt = double(a.tokens) - b.tokens, dc = a.llm - b.llm;
          if (dt <= 0 && dc <= 0) continue;
          const double w = std::max(score(st->tokens[m] - dt, st->cost[m] - dc),
                                    score(st->tokens[n] + dt, st->cost[n] + dc));
          if (w < best) {
            best = w;
            bi = static_cast<int>(i);
            bj = static_cast<int>(j);
          }
        }
      }
      if (bi < 0) return;
      const PackItem& a = p.text[bi];
      if (bj < 0) {
        if (!TryMove(&st->text, &out->text_slot[bi], a, n)) return;
        Apply(st, m, a, -1, false);
        Apply(st, n, a, +1, false);
        Erase(&st->items[m], bi);
        st->items[n].push_back(bi);
      } else {
        const PackItem& b = p.text[bj];
        if (!TrySwap(&st->text, &out->text_slot[bi], a, &out->text_slot[bj], b)) return;
        Apply(st, m, a, -1, false);
        Apply(st, n, a, +1, false);
        Apply(st, n, b, -1, false);
        Apply(st, m, b, +1, false);
        Erase(&st->items[m], bi);
        Erase(&st->items[n], bj);
        st->items[n].push_back(bi);
        st->items[m].push_back(bj);
      }
    }
  }

  const std::string name_ = "tutti";
  uint32_t rounds_;
};

}  // namespace

std::unique_ptr<PackingStrategy> MakeTuttiStrategy(uint32_t improvement_rounds) {
  return std::make_unique<TuttiStrategy>(improvement_rounds);
}

}  // namespace tutti::packer
