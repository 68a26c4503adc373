// An indexed binary min-heap over ranks keyed by an external load array, so
// a rank's key can change in O(log W) and the k least-loaded ranks can be
// listed without popping. Ties go to the lower rank (deterministic).
#ifndef TUTTI_SERVICES_PACKER_CORE_RANK_HEAP_H_
#define TUTTI_SERVICES_PACKER_CORE_RANK_HEAP_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace tutti::packer {

class RankHeap {
 public:
  // Builds the heap over ranks [0, n) keyed by keys[r] (kept by pointer).
  void Init(uint32_t n, const double* keys) {
    key_ = keys;
    heap_.resize(n);
    pos_.resize(n);
    for (uint32_t r = 0; r < n; ++r) heap_[r] = pos_[r] = r;
    for (uint32_t i = n / 2; i-- > 0;) Down(i);
  }
  // Call after keys[r] changed.
  void Update(uint32_t r) {
    Up(pos_[r]);
    Down(pos_[r]);
  }
  uint32_t Top() const { return heap_[0]; }
  uint32_t size() const { return static_cast<uint32_t>(heap_.size()); }

  // The first rank in key order (ties: lower rank) for which take(r) is
  // true, or -1: ranks are visited best first through a frontier of the
  // heap, so the cost is about the number of ranks visited, times log.
  template <typename Take>
  int64_t FirstWhere(Take take) const {
    if (heap_.empty()) return -1;
    if (take(heap_[0])) return heap_[0];
    // The frontier (heap positions), best first: while it is small, an
    // array scanned for its best; beyond, a heap. Either pops in the same
    // order (no two ranks compare equal).
    const uint32_t n = static_cast<uint32_t>(heap_.size());
    uint32_t small[kSmallFrontier];
    uint32_t ns = 0;
    for (uint32_t c = 1; c <= 2 && c < n; ++c) small[ns++] = c;
    while (ns > 0) {
      uint32_t best = 0;
      for (uint32_t f = 1; f < ns; ++f) {
        if (Less(heap_[small[f]], heap_[small[best]])) best = f;
      }
      const uint32_t i = small[best];
      small[best] = small[--ns];
      if (take(heap_[i])) return heap_[i];
      if (ns + 2 > kSmallFrontier) {
        small[ns++] = i;  // not visited again: its children replace it below
        return FirstWhereInHeap(take, small, ns);
      }
      for (uint32_t c = 2 * i + 1; c <= 2 * i + 2 && c < n; ++c) small[ns++] = c;
    }
    return -1;
  }

  // Writes the k smallest ranks (k <= 16) in key order; returns how many.
  uint32_t Smallest(uint32_t k, uint32_t* out) const {
    uint32_t frontier[48];
    uint32_t nf = 0, got = 0;
    if (heap_.empty()) return 0;
    frontier[nf++] = 0;
    while (got < k && nf > 0) {
      uint32_t best = 0;
      for (uint32_t f = 1; f < nf; ++f) {
        if (Less(heap_[frontier[f]], heap_[frontier[best]])) best = f;
      }
      const uint32_t i = frontier[best];
      frontier[best] = frontier[--nf];
      out[got++] = heap_[i];
      for (uint32_t c = 2 * i + 1; c <= 2 * i + 2 && c < heap_.size(); ++c) {
        if (nf < 48) frontier[nf++] = c;
      }
    }
    return got;
  }

 private:
  static constexpr uint32_t kSmallFrontier = 16;

  // FirstWhere's walk on from a frontier of `count` positions whose last
  // one was visited (its children are due).
  template <typename Take>
  int64_t FirstWhereInHeap(Take take, const uint32_t* start, uint32_t count) const {
    thread_local std::vector<uint32_t> frontier;  // heap positions, a min-heap by Less
    auto later = [&](uint32_t a, uint32_t b) { return Less(heap_[b], heap_[a]); };
    frontier.assign(start, start + count - 1);
    std::make_heap(frontier.begin(), frontier.end(), later);
    uint32_t i = start[count - 1];
    while (true) {
      for (uint32_t c = 2 * i + 1; c <= 2 * i + 2 && c < heap_.size(); ++c) {
        frontier.push_back(c);
        std::push_heap(frontier.begin(), frontier.end(), later);
      }
      if (frontier.empty()) return -1;
      std::pop_heap(frontier.begin(), frontier.end(), later);
      i = frontier.back();
      frontier.pop_back();
      if (take(heap_[i])) return heap_[i];
    }
  }

  bool Less(uint32_t a, uint32_t b) const {
    return key_[a] < key_[b] || (key_[a] == key_[b] && a < b);
  }
  // Up and Down move the rank at heap position i through a hole (one
  // write per level, no swaps); the child to follow is chosen without a
  // branch. The arrangement is the same as with swaps.
  void Up(uint32_t i) {
    const uint32_t x = heap_[i];
    const double kx = key_[x];
    while (i > 0) {
      const uint32_t p = (i - 1) / 2;
      const uint32_t hp = heap_[p];
      const double kp = key_[hp];
      if (!(kx < kp || (kx == kp && x < hp))) break;
      heap_[i] = hp;
      pos_[hp] = i;
      i = p;
    }
    heap_[i] = x;
    pos_[x] = i;
  }
  void Down(uint32_t i) {
    const uint32_t n = static_cast<uint32_t>(heap_.size());
    const uint32_t x = heap_[i];
    const double kx = key_[x];
    while (true) {
      const uint32_t l = 2 * i + 1;
      if (l >= n) break;
      uint32_t c = l, hc = heap_[l];
      double kc = key_[hc];
      if (l + 1 < n) {
        const uint32_t hr = heap_[l + 1];
        const double kr = key_[hr];
        // Bitwise, not short-circuit: a select, not a branch.
        const bool right = (kr < kc) | ((kr == kc) & (hr < hc));
        c = right ? l + 1 : l;
        hc = right ? hr : hc;
        kc = right ? kr : kc;
      }
      if (!(kc < kx || (kc == kx && hc < x))) break;
      heap_[i] = hc;
      pos_[hc] = i;
      i = c;
    }
    heap_[i] = x;
    pos_[x] = i;
  }

  const double* key_ = nullptr;
  std::vector<uint32_t> heap_;
  std::vector<uint32_t> pos_;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_RANK_HEAP_H_
