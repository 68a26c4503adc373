#include "services/packer/core/tutti_search.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "services/packer/core/radix_sort.h"

namespace tutti::packer::tutti_internal {
namespace {

// A candidate change: item i of `from` to `to`, and item j (or none) of
// `to` back to `from`; in the ViT phase, possibly with a text document
// moved between the two ranks to keep the LLM maximum (comp).
struct Change {
  double value;  // the larger of the two ranks' new loads (lower is better)
  Side* side = nullptr;
  uint32_t i = 0;
  int64_t j = -1;
  uint32_t to = 0;
  int64_t comp = -1;     // text item
  uint32_t comp_to = 0;  // its new rank
};

// The text document of rank `src` with the least LLM cost in [need, room]
// that a text sequence of `dst` takes, or -1.
int64_t Compensation(const Side& text, uint32_t src, uint32_t dst, double need, double room) {
  int64_t best = -1;
  for (uint32_t t : text.lists[src]) {
    const double c = text.items[t].llm;
    if (c < need || c > room || (best >= 0 && c >= text.items[best].llm)) continue;
    if (text.rooms.Fit(dst, text.items[t]) >= 0) best = t;
  }
  return best;
}

// Whether new LLM costs a_cost of rank a and b_cost of rank b keep within
// `cap`, with a text document of `comp` (when given) taken from the one
// above it to the other: then its item in *t and its new rank in *t_to
// (*t stays -1 when none needs to move).
bool WithinCap(const Side* comp, uint32_t a, double a_cost, uint32_t b, double b_cost, double cap,
               int64_t* t, uint32_t* t_to) {
  if (a_cost <= cap && b_cost <= cap) return true;
  if (comp == nullptr || (a_cost > cap && b_cost > cap)) return false;
  const bool from_a = a_cost > cap;
  *t_to = from_a ? b : a;
  *t = Compensation(*comp, from_a ? a : b, *t_to, (from_a ? a_cost : b_cost) - cap,
                    cap - (from_a ? b_cost : a_cost));
  return *t >= 0;
}

// The best change of `side` between `hi` and `lo` in the phase `load`
// (key = the item's cost in that phase), keeping the other phase's loads
// (`other`, costs `okey`) at most `cap`; with `comp` (the ViT phase), a
// VL change that would raise one rank's LLM cost above `cap` may take a
// text document of that rank to the other.
template <typename Key, typename OKey>
void Best(Side& side, uint32_t hi, uint32_t lo, const std::vector<double>& load, Key key,
          const std::vector<double>& other, OKey okey, double cap, bool bind_other,
          const Side* comp, Change* best) {
  const double h = load[hi], l = load[lo], gap = h - l;
  const absl::Span<const PackItem> items = side.items;
  // d: key(a) - key(b), from the sorted lists, so that an item is read
  // only for a change that would improve on the best so far.
  auto consider = [&](uint32_t i, int64_t j, double d) {
    const double value = std::max(h - d, l + d);
    if (value >= best->value) return;
    const PackItem& a = items[i];
    const PackItem* b = j >= 0 ? &items[j] : nullptr;
    const uint32_t slot_b = j >= 0 ? (*side.slot)[j] : UINT32_MAX;
    if (side.rooms.Fit(lo, a, b, slot_b) < 0) return;
    if (b != nullptr && side.rooms.Fit(hi, *b, &a, (*side.slot)[i]) < 0) return;
    int64_t t = -1;
    uint32_t t_to = 0;
    if (bind_other) {
      const double od = okey(a) - (b ? okey(*b) : 0.0);
      const double new_lo = other[lo] + od, new_hi = other[hi] - od;
      if (!WithinCap(comp, lo, new_lo, hi, new_hi, cap, &t, &t_to)) return;
    }
    *best = Change{value, &side, i, j, lo, t, t_to};
  };
  // Both ranks' items by increasing key. A change helps only for
  // 0 < d < gap.
  const std::vector<std::pair<double, uint32_t>>& mine = side.Sorted(hi, key);
  for (const auto& [ka, i] : mine) {
    if (ka >= gap) break;
    if (ka > 0) consider(i, -1, ka);
  }
  const std::vector<std::pair<double, uint32_t>>& partners = side.Sorted(lo, key);
  if (partners.empty()) return;
  // Few items (a VL side, or small ranks): every pair with 0 < d < gap,
  // so that partners are found by both phases' costs at once.
  if (mine.size() * partners.size() <= kAllPairs) {
    size_t first = 0;  // the first partner with key > ka - gap
    for (const auto& [ka, i] : mine) {
      while (first < partners.size() && partners[first].first <= ka - gap) ++first;
      for (size_t q = first; q < partners.size() && partners[q].first < ka; ++q) {
        consider(i, partners[q].second, ka - partners[q].first);
      }
    }
    return;
  }
  // Swaps: the best partner b of a moves about half the gap, key(b) near
  // key(a) - gap / 2; the partners around that key are tried, found in
  // one merge of the two sorted lists.
  size_t at = 0;
  for (const auto& [ka, i] : mine) {
    const std::pair<double, uint32_t> want(ka - gap / 2, 0u);
    while (at < partners.size() && KeyLess()(partners[at], want)) ++at;
    for (size_t q = at > 2 ? at - 2 : 0; q < std::min(partners.size(), at + 2); ++q) {
      const double d = ka - partners[q].first;
      if (d > 0 && d < gap) consider(i, partners[q].second, d);
    }
  }
}

// Rank r's place in the LLM heaps, and in the ViT heaps too when `vit`,
// after its loads changed.
void Reheap(uint32_t r, bool vit, State* st) {
  st->neg_llm[r] = -st->llm[r];
  st->llm_min.Update(r);
  st->llm_max.Update(r);
  if (vit) {
    st->neg_vit[r] = -st->vit[r];
    st->vit_min.Update(r);
    st->vit_max.Update(r);
  }
}

// Text document t to rank `to` (a text sequence of which has room for
// it), with both ranks' LLM cost; the caller updates the heaps.
void MoveText(uint32_t t, uint32_t to, State* st) {
  Side& text = st->text;
  const PackItem& doc = text.items[t];
  const uint32_t src = text.RankOf(t);
  text.Unlist(t);
  text.rooms.Remove((*text.slot)[t], doc);
  (*text.slot)[t] = to * text.rooms.per() + static_cast<uint32_t>(text.rooms.Fit(to, doc));
  text.rooms.Add((*text.slot)[t], doc);
  text.Relist(t);
  st->llm[src] -= doc.llm;
  st->llm[to] += doc.llm;
}

// Applies a change found by Best and updates loads and heaps.
void Apply(const Change& c, uint32_t from, State* st) {
  Side& s = *c.side;
  const PackItem& a = s.items[c.i];
  const PackItem* b = c.j >= 0 ? &s.items[c.j] : nullptr;
  const uint32_t slot_a = (*s.slot)[c.i];
  const uint32_t slot_b = b ? (*s.slot)[c.j] : UINT32_MAX;
  const uint32_t per = s.rooms.per();
  s.Unlist(c.i);
  s.rooms.Remove(slot_a, a);
  if (b) {
    s.Unlist(static_cast<uint32_t>(c.j));
    s.rooms.Remove(slot_b, *b);
    const int qb = s.rooms.Fit(from, *b);
    (*s.slot)[c.j] = from * per + static_cast<uint32_t>(qb);
    s.rooms.Add((*s.slot)[c.j], *b);
    s.Relist(static_cast<uint32_t>(c.j));
  }
  const int qa = s.rooms.Fit(c.to, a);
  (*s.slot)[c.i] = c.to * per + static_cast<uint32_t>(qa);
  s.rooms.Add((*s.slot)[c.i], a);
  s.Relist(c.i);
  const double dl = a.llm - (b ? b->llm : 0.0);
  st->llm[from] -= dl;
  st->llm[c.to] += dl;
  if (c.comp >= 0) MoveText(static_cast<uint32_t>(c.comp), c.comp_to, st);
  if (s.vl) {
    ++st->vl_changes;
    const double dv = a.vit - (b ? b->vit : 0.0);
    st->vit[from] -= dv;
    st->vit[c.to] += dv;
  }
  for (uint32_t r : {from, c.to}) Reheap(r, s.vl, st);
}

// What a change in one phase may raise the other phase to: its maximum
// (or, before the text documents are placed, the LLM budget), and at
// least the point where its own search would stop (kDone over its bound).
double OtherCap(const State& st, bool vit_phase) {
  if (vit_phase) {
    return st.llm_cap >= 0 ? st.llm_cap
                           : std::max(st.llm[st.llm_max.Top()], st.llm_lb * (1 + kDone));
  }
  return std::max(st.vit[st.vit_max.Top()], st.vit_lb * (1 + kDone));
}

// Resplit for the rank hi: the best division of its VL samples with one
// of the kWideReceivers least loaded ranks that brings both below hi's
// ViT cost, applied. False when there is none.
bool ResplitRank(State* st, uint32_t hi, uint32_t width) {
  Side& vl = st->vl;
  const Rooms& rooms = vl.rooms;
  const double h = st->vit[hi];
  if (vl.lists[hi].size() >= kResplitItems) return false;
  const Side* text = st->text_placed ? &st->text : nullptr;
  const double cap = OtherCap(*st, true);
  const uint32_t seq_len = rooms.seq_len(), img_cap = rooms.img_cap();
  uint32_t receivers[kWideReceivers];
  const uint32_t n = st->vit_min.Smallest(width, receivers);
  double best = h * (1 - kGain);
  uint32_t best_lo = 0, best_mask = 0, best_comp_to = 0;
  int64_t best_comp = -1;
  bool found = false;
  std::vector<uint32_t>& both = st->both;
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t lo = receivers[k];
    if (lo == hi || st->vit[lo] >= h) continue;
    const size_t m = vl.lists[hi].size() + vl.lists[lo].size();
    if (m > kResplitItems || m < 2) continue;
    both.assign(vl.lists[hi].begin(), vl.lists[hi].end());
    both.insert(both.end(), vl.lists[lo].begin(), vl.lists[lo].end());
    // Sums over all of both, and over the samples on hi (bit set).
    double vit_all = 0, llm_all = 0, vit_hi = 0, llm_hi = 0;
    uint64_t tok_all = 0, img_all = 0, tok_hi = 0, img_hi = 0;
    for (size_t x = 0; x < m; ++x) {
      const PackItem& it = vl.items[both[x]];
      vit_all += it.vit, llm_all += it.llm, tok_all += it.tokens, img_all += it.image_tokens;
      if (x < vl.lists[hi].size()) {
        vit_hi += it.vit, llm_hi += it.llm, tok_hi += it.tokens, img_hi += it.image_tokens;
      }
    }
    // LLM cost of each rank without its VL samples.
    const double llm_base_hi = st->llm[hi] - llm_hi, llm_base_lo = st->llm[lo] - (llm_all - llm_hi);
    const uint32_t start = (1u << vl.lists[hi].size()) - 1;
    for (uint32_t g = 1; g < (1u << m); ++g) {
      const int x = __builtin_ctz(g);
      const PackItem& it = vl.items[both[x]];
      const uint32_t mask = start ^ g ^ (g >> 1);
      if (mask >> x & 1) {
        vit_hi += it.vit, llm_hi += it.llm, tok_hi += it.tokens, img_hi += it.image_tokens;
      } else {
        vit_hi -= it.vit, llm_hi -= it.llm, tok_hi -= it.tokens, img_hi -= it.image_tokens;
      }
      const double value = std::max(vit_hi, vit_all - vit_hi);
      if (value >= best) continue;
      if (tok_hi > seq_len || tok_all - tok_hi > seq_len) continue;
      if (img_cap > 0 && (img_hi > img_cap || img_all - img_hi > img_cap)) continue;
      // A division that raises one rank's LLM cost above the cap may
      // take a text document of that rank to the other (as a round's
      // changes do).
      const double new_hi = llm_base_hi + llm_hi, new_lo = llm_base_lo + (llm_all - llm_hi);
      int64_t t = -1;
      uint32_t t_to = 0;
      if (!WithinCap(text, hi, new_hi, lo, new_lo, cap, &t, &t_to)) continue;
      best = value, best_lo = lo, best_mask = mask, found = true;
      best_comp = t, best_comp_to = t_to;
    }
  }
  if (!found) return false;
  // The samples whose rank changes leave first, then take their new rank.
  both.assign(vl.lists[hi].begin(), vl.lists[hi].end());
  both.insert(both.end(), vl.lists[best_lo].begin(), vl.lists[best_lo].end());
  const size_t on_hi = vl.lists[hi].size();
  uint32_t movers[kResplitItems], to[kResplitItems], count = 0;
  for (size_t x = 0; x < both.size(); ++x) {
    const bool was_hi = x < on_hi, stays_hi = best_mask >> x & 1;
    if (was_hi == stays_hi) continue;
    movers[count] = both[x];
    to[count++] = stays_hi ? hi : best_lo;
  }
  for (uint32_t c = 0; c < count; ++c) {
    const uint32_t i = movers[c];
    vl.Unlist(i);
    vl.rooms.Remove((*vl.slot)[i], vl.items[i]);
  }
  for (uint32_t c = 0; c < count; ++c) {
    const uint32_t i = movers[c];
    const PackItem& it = vl.items[i];
    const uint32_t from = to[c] == hi ? best_lo : hi;
    (*vl.slot)[i] = to[c];  // one VL sequence per rank
    vl.rooms.Add(to[c], it);
    vl.Relist(i);
    st->vit[from] -= it.vit, st->vit[to[c]] += it.vit;
    st->llm[from] -= it.llm, st->llm[to[c]] += it.llm;
  }
  if (best_comp >= 0) MoveText(static_cast<uint32_t>(best_comp), best_comp_to, st);
  for (uint32_t r : {hi, best_lo}) Reheap(r, true, st);
  return true;
}

// The best division of the VL samples of the slowest ViT rank and one of
// the kWideReceivers least loaded ranks between the two: every
// assignment (a Gray-code walk, one sample changes rank a step), keeping
// both ranks' VL tokens and image tokens within their VL sequence and
// their LLM cost within the cap (or, with a text document taken along,
// as a round's changes may). It reaches the exchanges of several samples
// for several that a round's moves and swaps cannot, where the VL
// sequences' room binds. When the slowest rank has none, the same for
// the next kResplitSlow - 1 slowest ones with the kReceivers least
// loaded: that lowers no maximum, but gives the slowest rank other
// partners to divide with. One VL sequence per rank; two ranks holding
// more than kResplitItems VL samples are passed over. False when no
// division lowers the slower of the two below the rank it was tried for.
bool Resplit(State* st) {
  Side& vl = st->vl;
  if (vl.rooms.per() != 1) return false;
  const uint32_t top = st->vit_max.Top();
  if (st->vit[top] <= st->vit_lb * (1 + kDone)) return false;
  // Tried once per arrangement of the VL samples in each search
  // (StartSearch forgets): the LLM rounds in between seldom open a
  // division the last try did not find, and trying costs 2^n a pair.
  if (st->resplit_failed == st->vl_changes) return false;
  // The slowest rank first; when it has no division, the next slowest
  // ones (lowering them changes what the slowest can be divided with).
  uint32_t slow[kResplitSlow];
  const uint32_t n = st->vit_max.Smallest(kResplitSlow, slow);
  for (uint32_t k = 0; k < n; ++k) {
    if (ResplitRank(st, slow[k], k == 0 ? kWideReceivers : kReceivers)) {
      ++st->vl_changes;
      return true;
    }
  }
  st->resplit_failed = st->vl_changes;
  return false;
}

bool RoundWith(const PackProblem& p, State* st, bool vit_phase, uint32_t width) {
  const double lower_bound = vit_phase ? st->vit_lb : st->llm_lb;
  std::vector<double>& load = vit_phase ? st->vit : st->llm;
  std::vector<double>& other = vit_phase ? st->llm : st->vit;
  const uint32_t hi = vit_phase ? st->vit_max.Top() : st->llm_max.Top();
  const double h = load[hi];
  if (h <= lower_bound * (1 + kDone)) return false;
  const double cap = OtherCap(*st, vit_phase);
  const bool with_text = st->text_placed;
  // Receivers: the least loaded ranks, the least loaded ones with room
  // for the smallest of hi's items (a full rank takes only swaps), and in
  // the LLM phase the ranks with the least ViT cost (for VL samples).
  uint32_t receivers[3 * kWideReceivers];
  const RankHeap& heap = vit_phase ? st->vit_min : st->llm_min;
  uint32_t n = heap.Smallest(width, receivers);
  const Side& movable = vit_phase || !with_text ? st->vl : st->text;
  uint32_t smallest = UINT32_MAX;
  for (uint32_t i : movable.lists[hi]) smallest = std::min(smallest, movable.items[i].tokens);
  const uint32_t n_least = n;
  if (smallest != UINT32_MAX) {
    uint32_t visited = 0;
    heap.FirstWhere([&](uint32_t r) {
      if (++visited > kRoomScan) return true;
      if (movable.rooms.MaxRoom(r) < smallest) return false;
      if (std::find(receivers, receivers + n_least, r) == receivers + n_least) receivers[n++] = r;
      return n >= n_least + width;
    });
  }
  const uint32_t n_own = n;
  if (!vit_phase && p.balance_vit) n += st->vit_min.Smallest(width, receivers + n);
  Change best{h * (1 - kGain)};
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t lo = receivers[k];
    if (lo == hi || load[lo] >= h) continue;
    // VL samples carry both phases; text samples only the LLM phase.
    if (vit_phase) {
      Best(st->vl, hi, lo, load, VitOf(), other, LlmOf(), cap, true,
           with_text ? &st->text : nullptr, &best);
      continue;
    }
    Best(st->vl, hi, lo, load, LlmOf(), other, VitOf(), cap, p.balance_vit, nullptr, &best);
    if (k < n_own && with_text) {
      Best(st->text, hi, lo, load, LlmOf(), other, VitOf(), cap, false, nullptr, &best);
    }
  }
  if (best.side == nullptr) return false;
  Apply(best, hi, st);
  return true;
}

// One pass pairing the k-th slowest rank of a phase with the k-th
// fastest, k = 0, 1, ... while the slower one is above kDone over the
// bound: the best change between the two (as a round with that one
// receiver); a slow rank with no change tries the next fast ones (up to
// kPairTriesVit / kPairTriesLlm in all). A fast rank takes at most one
// change a pass. Evens out many ranks for one partner search per pair.
// False when nothing moved.
bool PairPass(const PackProblem& p, State* st, bool vit_phase) {
  const uint32_t W = p.ranks;
  const double lower_bound = vit_phase ? st->vit_lb : st->llm_lb;
  std::vector<double>& load = vit_phase ? st->vit : st->llm;
  std::vector<double>& other = vit_phase ? st->llm : st->vit;
  const double cap = OtherCap(*st, vit_phase);
  const bool with_text = st->text_placed;
  std::vector<uint64_t>& by_load = st->by_load;
  by_load.resize(W);
  for (uint32_t r = 0; r < W; ++r) {
    const float f = static_cast<float>(load[r]);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);  // non-negative floats order like their bits
    by_load[r] = uint64_t{bits} << 32 | r;
  }
  RadixSort64(&by_load, &st->radix);
  bool moved = false;
  uint32_t b = 0;
  const double stop = lower_bound * (1 + kDone);
  for (uint32_t k = W; k-- > 0 && k > b;) {
    const uint32_t hi = static_cast<uint32_t>(by_load[k]);
    const double h = load[hi];
    if (h <= stop) break;
    const uint32_t tries = vit_phase ? kPairTriesVit : kPairTriesLlm;
    for (uint32_t t = b; t < std::min(k, b + tries); ++t) {
      const uint32_t lo = static_cast<uint32_t>(by_load[t]);
      if (load[lo] >= h) break;
      ++st->pair_tries;
      Change best{h * (1 - kGain)};
      if (vit_phase) {
        Best(st->vl, hi, lo, load, VitOf(), other, LlmOf(), cap, true,
             with_text ? &st->text : nullptr, &best);
      } else {
        Best(st->vl, hi, lo, load, LlmOf(), other, VitOf(), cap, p.balance_vit, nullptr, &best);
        if (with_text) {
          Best(st->text, hi, lo, load, LlmOf(), other, VitOf(), cap, false, nullptr, &best);
        }
      }
      if (best.side == nullptr) continue;
      Apply(best, hi, st);
      std::swap(by_load[t], by_load[b++]);
      moved = true;
      break;
    }
  }
  return moved;
}

}  // namespace

bool Round(const PackProblem& p, State* st, bool vit_phase) {
  if (RoundWith(p, st, vit_phase, kReceivers)) return true;
  if (!vit_phase) return false;
  return (p.ranks > kReceivers && RoundWith(p, st, vit_phase, kWideReceivers)) || Resplit(st);
}

void Passes(const PackProblem& p, State* st, bool vit_phase, uint64_t budget, uint64_t* rounds) {
  for (int pass = 0; pass < kPairPasses && *rounds < budget; ++pass) {
    st->pair_tries = 0;
    const bool moved = PairPass(p, st, vit_phase);
    *rounds += (st->pair_tries + 2 * kReceivers - 1) / (2 * kReceivers);
    if (!moved) break;
  }
}

void StartSearch(const PackProblem& p, State* st) {
  const uint32_t W = p.ranks;
  st->vl.BuildLists(W);
  if (st->text_placed) st->text.BuildLists(W);
  for (uint32_t r = 0; r < W; ++r) {
    st->neg_llm[r] = -st->llm[r];
    st->neg_vit[r] = -st->vit[r];
  }
  st->llm_min.Init(W, st->llm.data());
  st->vit_min.Init(W, st->vit.data());
  st->llm_max.Init(W, st->neg_llm.data());
  st->vit_max.Init(W, st->neg_vit.data());
  st->resplit_failed = UINT64_MAX;
}

}  // namespace tutti::packer::tutti_internal
