// The tutti strategy's placement (steps 1-3 of tutti_strategy.cc): the
// lower bounds, items in key order, and longest processing time first onto
// the least loaded rank with room (small items in batches), or onto given
// ranks. Internal to the strategy.
#ifndef TUTTI_SERVICES_PACKER_CORE_TUTTI_PLACE_H_
#define TUTTI_SERVICES_PACKER_CORE_TUTTI_PLACE_H_

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "services/packer/core/packing.h"
#include "services/packer/core/radix_sort.h"
#include "services/packer/core/tutti_state.h"

namespace tutti::packer::tutti_internal {

// Lower bounds max(mean, largest item) of both phases, and the LLM
// budget of ranks holding a large document.
void Bounds(const PackProblem& p, State* st);

// The error of a side none of whose sequences has room left for `it`.
absl::Status NoRoom(const PackProblem& p, const Side& side, const PackItem& it);

// The items of `side` by decreasing key (ties: lower item) into
// st->order, optionally only those with select(item). Keys are compared
// as floats (a relative 6e-8; closer keys count as equal).
template <typename Key, typename Select>
void Order(const Side& side, Key key, Select select, State* st) {
  std::vector<uint64_t>& order = st->order;
  order.clear();
  for (uint32_t i = 0; i < side.items.size(); ++i) {
    if (!select(side.items[i])) continue;
    const float k = static_cast<float>(key(side.items[i]));
    uint32_t bits;
    std::memcpy(&bits, &k, 4);  // non-negative floats order like their bits
    order.push_back(uint64_t{~bits} << 32 | i);
  }
  // Stable LSD radix sort on the upper 32 bits (11 bits a pass).
  std::vector<uint64_t>& tmp = st->tmp;
  tmp.resize(order.size());
  uint32_t count[2048];
  for (int shift = 32; shift < 64; shift += 11) {
    std::fill(count, count + 2048, 0);
    for (uint64_t x : order) ++count[(x >> shift) & 2047];
    uint32_t sum = 0;
    for (uint32_t& c : count) {
      const uint32_t n = c;
      c = sum;
      sum += n;
    }
    for (uint64_t x : order) tmp[count[(x >> shift) & 2047]++] = x;
    order.swap(tmp);
  }
}

// The rank with the least load that has a sequence for `it` (its
// sequence in *q), allowed ranks first; -1 when none has.
template <typename Allowed>
int64_t LeastLoadedTaker(const Rooms& rooms, uint32_t W, const std::vector<double>& load,
                         const PackItem& it, Allowed allowed, int* q) {
  int64_t best = -1;
  for (int pass = 0; pass < 2 && best < 0; ++pass) {
    for (uint32_t c = 0; c < W; ++c) {
      if (best >= 0 && load[c] >= load[best]) continue;
      if (pass == 0 && !allowed(c, it)) continue;
      const int qc = rooms.Fit(c, it);
      if (qc >= 0) best = c, *q = qc;
    }
  }
  return best;
}

// The items st->order[from...] (small ones) in batches: the B largest go
// to the B least loaded ranks, largest to least loaded, then the ranks
// are ranked again. LPT up to the order within a batch, without a heap
// operation per item. An item its rank has no room for (or is not
// allowed on) goes to the least loaded rank that takes it.
template <typename Key, typename Allowed, typename Placed>
absl::Status LptBatches(const PackProblem& p, State* st, Side* side, Key key,
                        std::vector<double>* load, Allowed allowed, Placed placed, size_t from) {
  const uint32_t W = p.ranks;
  const uint32_t B = std::max(1u, W / kBatchDivisor);
  const absl::Span<const PackItem> items = side->items;
  const std::vector<uint64_t>& order = st->order;
  Rooms& rooms = side->rooms;
  const uint32_t per = rooms.per();
  // Every rank by (key, rank), ascending: each batch re-sorts only the
  // ranks whose key changed and merges them with the rest.
  std::vector<uint64_t>& ranked = st->tmp;
  std::vector<uint64_t>& kept = st->kept;
  std::vector<uint64_t>& moved = st->moved;
  std::vector<uint32_t>& bits_of = st->bits_of;
  bool first = true;
  auto place = [&](uint32_t r, int q, uint32_t i) {
    const uint32_t slot = r * per + static_cast<uint32_t>(q);
    (*side->slot)[i] = slot;
    rooms.Add(slot, items[i]);
    (*load)[r] += key(items[i]);
    placed(r, items[i]);
  };
  for (size_t k0 = from; k0 < order.size(); k0 += B) {
    const size_t n = std::min<size_t>(B, order.size() - k0);
    // A rank without room for the batch's smallest item ranks last.
    uint32_t smallest = UINT32_MAX;
    for (size_t k = 0; k < n; ++k) {
      if (k0 + k + kPrefetch < order.size()) {
        __builtin_prefetch(&items[static_cast<uint32_t>(order[k0 + k + kPrefetch])]);
      }
      smallest = std::min(smallest, items[static_cast<uint32_t>(order[k0 + k])].tokens);
    }
    bits_of.resize(W);
    for (uint32_t r = 0; r < W; ++r) {
      const float f = rooms.MaxRoom(r) < smallest ? HUGE_VALF : static_cast<float>((*load)[r]);
      std::memcpy(&bits_of[r], &f, 4);  // non-negative floats order like their bits
    }
    if (first) {
      ranked.resize(W);
      for (uint32_t r = 0; r < W; ++r) ranked[r] = uint64_t{bits_of[r]} << 32 | r;
      RadixSort64(&ranked, &st->radix);
      first = false;
    } else {
      kept.clear();
      moved.clear();
      for (const uint64_t e : ranked) {
        const uint32_t r = static_cast<uint32_t>(e);
        if (bits_of[r] == e >> 32) {
          kept.push_back(e);
        } else {
          moved.push_back(uint64_t{bits_of[r]} << 32 | r);
        }
      }
      RadixSort64(&moved, &st->radix);
      std::merge(kept.begin(), kept.end(), moved.begin(), moved.end(), ranked.begin());
    }
    for (size_t k = 0; k < n; ++k) {
      const uint32_t i = static_cast<uint32_t>(order[k0 + k]);
      const PackItem& it = items[i];
      uint32_t r = static_cast<uint32_t>(ranked[k]);
      int q = allowed(r, it) ? rooms.Fit(r, it) : -1;
      // Else the next ranks of the batch's ranking, then the least loaded
      // rank that takes it (allowed ones first).
      for (size_t next = k + 1; q < 0 && next < n; ++next) {
        r = static_cast<uint32_t>(ranked[next]);
        q = allowed(r, it) ? rooms.Fit(r, it) : -1;
      }
      if (q < 0) {
        const int64_t best = LeastLoadedTaker(rooms, W, *load, it, allowed, &q);
        if (best < 0) return NoRoom(p, *side, it);
        r = static_cast<uint32_t>(best);
      }
      place(r, q, i);
    }
  }
  return absl::OkStatus();
}

// Places the items of st->order, in order, each onto the rank with the
// least load that has room for it (ties: lower rank), adding key(item) to
// the load and calling placed(rank, item). Ranks where allowed(rank,
// item) is false are passed over unless no allowed rank has room.
template <typename Key, typename Allowed, typename Placed>
absl::Status Lpt(const PackProblem& p, State* st, Side* side, Key key, std::vector<double>* load,
                 Allowed allowed, Placed placed) {
  const uint32_t W = p.ranks;
  const absl::Span<const PackItem> items = side->items;
  std::vector<double>& k = st->key;
  for (uint32_t r = 0; r < W; ++r) k[r] = (*load)[r];
  st->lpt.Init(W, k.data());
  // Ranks without room for the current item sleep (key +inf) until an
  // item small enough comes; their max room orders them.
  std::vector<std::pair<uint32_t, uint32_t>>& sleeping = st->sleeping;
  sleeping.clear();
  std::vector<uint32_t>& fell_asleep = st->fell_asleep;
  Rooms& rooms = side->rooms;
  const uint32_t per = rooms.per();
  // Items worth less than kSmall of a rank's mean load go in batches (at
  // W = 2560, 0.26 MP, about 30 VL samples a rank: a tenth of the plan
  // time by heap).
  double total = 0;
  for (const uint64_t entry : st->order) total += key(items[static_cast<uint32_t>(entry)]);
  for (uint32_t r = 0; r < W; ++r) total += (*load)[r];
  const double small = kSmall * total / W;
  // Items come in key order, scattered over the item array: fetched
  // kPrefetch items ahead.
  for (size_t n = 0; n < st->order.size(); ++n) {
    if (n + kPrefetch < st->order.size()) {
      __builtin_prefetch(&items[static_cast<uint32_t>(st->order[n + kPrefetch])]);
    }
    const uint32_t i = static_cast<uint32_t>(st->order[n]);
    const PackItem& it = items[i];
    if (key(it) < small) return LptBatches(p, st, side, key, load, allowed, placed, n);
    while (!sleeping.empty() && sleeping.front().first >= it.tokens) {
      const uint32_t r = sleeping.front().second;
      std::pop_heap(sleeping.begin(), sleeping.end());
      sleeping.pop_back();
      k[r] = (*load)[r];
      st->lpt.Update(r);
    }
    int q = -1;
    bool passed_over = false;
    fell_asleep.clear();
    auto take = [&](uint32_t c, bool check_allowed) {
      if (std::isinf(k[c])) return false;
      q = rooms.Fit(c, it);
      if (q >= 0) {
        if (!check_allowed || allowed(c, it)) return true;
        passed_over = true;
        return false;
      }
      const uint32_t room = rooms.MaxRoom(c);
      if (room < it.tokens) {  // asleep until an item of at most `room` tokens
        sleeping.emplace_back(room, c);
        std::push_heap(sleeping.begin(), sleeping.end());
        fell_asleep.push_back(c);
        k[c] = HUGE_VAL;
      }
      return false;
    };
    int64_t r = st->lpt.FirstWhere([&](uint32_t c) { return take(c, true); });
    if (r < 0 && passed_over) r = st->lpt.FirstWhere([&](uint32_t c) { return take(c, false); });
    // Ranks put to sleep during the search are repositioned now.
    for (uint32_t c : fell_asleep) st->lpt.Update(c);
    if (r < 0) return NoRoom(p, *side, it);
    const uint32_t slot = static_cast<uint32_t>(r) * per + static_cast<uint32_t>(q);
    (*side->slot)[i] = slot;
    rooms.Add(slot, it);
    (*load)[r] += key(it);
    k[r] = (*load)[r];
    st->lpt.Update(static_cast<uint32_t>(r));
    placed(static_cast<uint32_t>(r), it);
  }
  return absl::OkStatus();
}

// The VL samples of st->order (by decreasing tokens) each onto its rank
// in `rank` where one of its VL sequences has room and allowed(rank,
// sample), else onto the rank with the least ViT cost that takes it
// (allowed ones first).
template <typename Allowed, typename Placed>
absl::Status Seeded(const PackProblem& p, State* st, const std::vector<uint32_t>& rank,
                    Allowed allowed, Placed placed) {
  Side& vl = st->vl;
  Rooms& rooms = vl.rooms;
  for (const uint64_t entry : st->order) {
    const uint32_t i = static_cast<uint32_t>(entry);
    const PackItem& it = vl.items[i];
    int64_t r = rank[i];
    int q = allowed(rank[i], it) ? rooms.Fit(rank[i], it) : -1;
    if (q < 0) r = LeastLoadedTaker(rooms, p.ranks, st->vit, it, allowed, &q);
    if (r < 0) return NoRoom(p, vl, it);
    const uint32_t slot = static_cast<uint32_t>(r) * rooms.per() + static_cast<uint32_t>(q);
    (*vl.slot)[i] = slot;
    rooms.Add(slot, it);
    placed(static_cast<uint32_t>(r), it);
  }
  return absl::OkStatus();
}

}  // namespace tutti::packer::tutti_internal

#endif  // TUTTI_SERVICES_PACKER_CORE_TUTTI_PLACE_H_
