// The balancers users would otherwise pick, as packing strategies on the
// same problem and constraints (seq_len, img_cap), so that benchmarks compare
// them with tutti's on the same steps:
//
//   lpt         longest processing time first: VL samples by decreasing ViT
//               cost onto the rank with the least ViT cost that can take
//               them, then text samples by decreasing LLM cost onto the rank
//               with the least LLM cost (VL included) that can take them
//   kk          Karmarkar-Karp multiway largest differencing (as verl's
//               get_seqlen_balanced_partitions) of the VL samples by ViT
//               cost and of the text samples by LLM cost; the heaviest text
//               part goes with the rank of the lightest VL LLM cost; each
//               rank's samples then fill its sequences first-fit decreasing
//   multipack   binary search on the largest rank cost C with first-fit
//               decreasing into ranks of capacity C (and their sequences)
//   sequential  no balancing: the drawn round-robin deal (sample k to rank
//               k % W), first fit decreasing into the rank's sequences (and
//               the same repair as kk)
//
// A rank takes a sample when one of its sequences of the sample's modality
// has room for its tokens (and image tokens under img_cap). Deterministic:
// every order breaks ties by position.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <queue>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/packer/core/packing.h"

namespace tutti::packer {
namespace {

// Per-rank sequences of one modality: tokens and image tokens per sequence.
class Sequences {
 public:
  Sequences(const PackProblem& p, uint32_t seqs)
      : seq_len_(p.seq_len), img_cap_(p.img_cap), seqs_(seqs) {
    tokens_.assign(size_t{p.ranks} * seqs, 0);
    images_.assign(size_t{p.ranks} * seqs, 0);
  }
  // The sequence of rank r with the most room that takes `it`, or -1.
  int Fit(uint32_t r, const PackItem& it) const {
    int best = -1;
    for (uint32_t q = 0; q < seqs_; ++q) {
      const size_t k = size_t{r} * seqs_ + q;
      if (tokens_[k] + it.tokens > seq_len_) continue;
      if (img_cap_ > 0 && images_[k] + it.image_tokens > img_cap_) continue;
      if (best < 0 || tokens_[k] < tokens_[size_t{r} * seqs_ + best]) best = static_cast<int>(q);
    }
    return best;
  }
  uint32_t Add(uint32_t r, int q, const PackItem& it) {
    const size_t k = size_t{r} * seqs_ + q;
    tokens_[k] += it.tokens;
    images_[k] += it.image_tokens;
    return static_cast<uint32_t>(k);
  }
  void Clear() {
    std::fill(tokens_.begin(), tokens_.end(), 0);
    std::fill(images_.begin(), images_.end(), 0);
  }

 private:
  uint32_t seq_len_, img_cap_, seqs_;
  std::vector<uint32_t> tokens_, images_;
};

double Key(const PackItem& it, bool vit) { return vit ? it.vit : it.llm; }

// Items by decreasing key, ties by position.
std::vector<uint32_t> Decreasing(absl::Span<const PackItem> items, bool vit) {
  std::vector<uint32_t> order(items.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return Key(items[a], vit) > Key(items[b], vit); });
  return order;
}

absl::Status NoRoom(const PackProblem& p, absl::string_view modality,
                    absl::Span<const PackItem> items, uint32_t seqs, absl::string_view name) {
  uint64_t tokens = 0;
  for (const PackItem& it : items) tokens += it.tokens;
  return CapacityError(modality, tokens, p.ranks, seqs, p.seq_len,
                       absl::StrCat(name, " found no rank with room for a sample"));
}

// Fills each rank's sequences with the samples `rank` gives it, first fit
// decreasing by tokens; a sample its rank has no room for goes to the rank
// with the least load (`load`, the balanced quantity) that has room.
absl::Status FillRanks(const PackProblem& p, absl::Span<const PackItem> items, uint32_t seqs,
                       const std::vector<uint32_t>& rank, bool vit, std::vector<double> load,
                       absl::string_view modality, absl::string_view name, uint32_t* slot) {
  Sequences s(p, seqs);
  for (uint32_t i = 0; i < items.size(); ++i) load[rank[i]] += Key(items[i], vit);
  std::vector<uint32_t> order(items.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return items[a].tokens > items[b].tokens; });
  for (uint32_t i : order) {
    uint32_t r = rank[i];
    int q = s.Fit(r, items[i]);
    if (q < 0) {
      load[r] -= Key(items[i], vit);
      int best = -1;
      for (uint32_t t = 0; t < p.ranks; ++t) {
        const int tq = s.Fit(t, items[i]);
        if (tq >= 0 && (best < 0 || load[t] < load[best])) best = static_cast<int>(t), q = tq;
      }
      if (best < 0) return NoRoom(p, modality, items, seqs, name);
      r = static_cast<uint32_t>(best);
      load[r] += Key(items[i], vit);
    }
    slot[i] = s.Add(r, q, items[i]);
  }
  return absl::OkStatus();
}

enum class Peer { kLpt, kKk, kMultipack, kSequential };

class PeerStrategy final : public PackingStrategy {
 public:
  PeerStrategy(std::string name, Peer peer) : name_(std::move(name)), peer_(peer) {}
  const std::string& name() const override { return name_; }

  absl::Status Pack(const PackProblem& p, PackResult* out) const override {
    out->text_slot.assign(p.text.size(), 0);
    out->vl_slot.assign(p.vl.size(), 0);
    std::vector<double> llm(p.ranks, 0.0);  // LLM cost per rank, VL first
    if (absl::Status s = PackModality(p, p.vl, p.vl_seqs_per_rank, p.balance_vit, "VL", &llm,
                                      out->vl_slot.data());
        !s.ok()) {
      return s;
    }
    return PackModality(p, p.text, p.text_seqs_per_rank, false, "text", &llm,
                        out->text_slot.data());
  }

 private:
  absl::Status PackModality(const PackProblem& p, absl::Span<const PackItem> items, uint32_t seqs,
                            bool vit, absl::string_view modality, std::vector<double>* llm,
                            uint32_t* slot) const {
    if (items.empty()) return absl::OkStatus();
    // Loads the modality balances: ViT cost (from zero) or LLM cost (on top
    // of what the VL samples put on each rank).
    std::vector<double> load = vit ? std::vector<double>(p.ranks, 0.0) : *llm;
    absl::Status s;
    switch (peer_) {
      case Peer::kLpt:
        s = Lpt(p, items, seqs, vit, modality, &load, slot);
        break;
      case Peer::kKk:
        s = Kk(p, items, seqs, vit, modality, load, slot);
        break;
      case Peer::kMultipack:
        s = Multipack(p, items, seqs, vit, modality, load, slot);
        break;
      case Peer::kSequential: {
        std::vector<uint32_t> rank(items.size());
        for (uint32_t i = 0; i < items.size(); ++i) rank[i] = i % p.ranks;
        s = FillRanks(p, items, seqs, rank, vit, load, modality, name_, slot);
        break;
      }
    }
    if (!s.ok()) return s;
    for (uint32_t i = 0; i < items.size(); ++i) (*llm)[slot[i] / seqs] += items[i].llm;
    return absl::OkStatus();
  }

  absl::Status Lpt(const PackProblem& p, absl::Span<const PackItem> items, uint32_t seqs, bool vit,
                   absl::string_view modality, std::vector<double>* load, uint32_t* slot) const {
    Sequences s(p, seqs);
    std::set<std::pair<double, uint32_t>> ranks;
    for (uint32_t r = 0; r < p.ranks; ++r) ranks.insert({(*load)[r], r});
    for (uint32_t i : Decreasing(items, vit)) {
      auto it = ranks.begin();
      int q = -1;
      for (; it != ranks.end() && (q = s.Fit(it->second, items[i])) < 0; ++it) {
      }
      if (it == ranks.end()) return NoRoom(p, modality, items, seqs, name_);
      const uint32_t r = it->second;
      ranks.erase(it);
      (*load)[r] += Key(items[i], vit);
      ranks.insert({(*load)[r], r});
      slot[i] = s.Add(r, q, items[i]);
    }
    return absl::OkStatus();
  }

  // Largest differencing: every sample starts as a W-way partition with one
  // non-empty part; the two partitions with the largest spread are merged,
  // heaviest part with lightest, until one is left.
  absl::Status Kk(const PackProblem& p, absl::Span<const PackItem> items, uint32_t seqs, bool vit,
                  absl::string_view modality, const std::vector<double>& base,
                  uint32_t* slot) const {
    const uint32_t W = p.ranks;
    struct Part {
      double sum;
      int32_t head, tail;  // items, as a linked list through next
    };
    std::vector<int32_t> next(items.size(), -1);
    // A partition: its non-empty parts by decreasing sum (the rest are empty).
    std::vector<std::vector<Part>> parts;
    parts.reserve(items.size());
    using Entry = std::pair<double, int64_t>;  // spread, -id (lower id first on ties)
    std::priority_queue<Entry> heap;
    auto spread = [&](const std::vector<Part>& v) {
      if (v.empty()) return 0.0;
      return v.front().sum - (v.size() < W ? 0.0 : v.back().sum);
    };
    for (uint32_t i = 0; i < items.size(); ++i) {
      parts.push_back({Part{Key(items[i], vit), int32_t(i), int32_t(i)}});
      heap.push({spread(parts.back()), -int64_t(i)});
    }
    while (heap.size() > 1) {
      const int64_t a = -heap.top().second;
      heap.pop();
      const int64_t b = -heap.top().second;
      heap.pop();
      std::vector<Part>& x = parts[a];
      std::vector<Part>& y = parts[b];
      std::vector<Part> merged(std::min<size_t>(W, x.size() + y.size()), Part{0, -1, -1});
      // Part i of x (decreasing) with part W-1-i of y (y is decreasing too).
      auto join = [&](Part* into, const Part& from) {
        if (from.head < 0) return;
        into->sum += from.sum;
        if (into->head < 0) {
          into->head = from.head;
        } else {
          next[into->tail] = from.head;
        }
        into->tail = from.tail;
      };
      std::vector<Part> full(W, Part{0, -1, -1});
      for (size_t i = 0; i < x.size(); ++i) join(&full[i], x[i]);
      for (size_t j = 0; j < y.size(); ++j) join(&full[W - 1 - j], y[j]);
      merged.clear();
      for (const Part& q : full) {
        if (q.head >= 0) merged.push_back(q);
      }
      std::stable_sort(merged.begin(), merged.end(),
                       [](const Part& l, const Part& r) { return l.sum > r.sum; });
      parts[a] = std::move(merged);
      std::vector<Part>().swap(parts[b]);
      heap.push({spread(parts[a]), -a});
    }
    std::vector<uint32_t> rank(items.size(), 0);
    if (!heap.empty()) {
      const std::vector<Part>& final_parts = parts[-heap.top().second];
      // Heaviest part onto the rank with the least load so far.
      std::vector<uint32_t> ranks(W);
      std::iota(ranks.begin(), ranks.end(), 0u);
      std::stable_sort(ranks.begin(), ranks.end(),
                       [&](uint32_t l, uint32_t r) { return base[l] < base[r]; });
      for (size_t k = 0; k < final_parts.size(); ++k) {
        for (int32_t i = final_parts[k].head; i >= 0; i = next[i]) rank[i] = ranks[k];
      }
    }
    return FillRanks(p, items, seqs, rank, vit, base, modality, name_, slot);
  }

  // Least load over rank ranges, to find the first rank with room fast.
  class MinTree {
   public:
    explicit MinTree(const std::vector<double>& v) : n_(1) {
      while (n_ < v.size()) n_ *= 2;
      t_.assign(2 * n_, std::numeric_limits<double>::infinity());
      for (size_t i = 0; i < v.size(); ++i) t_[n_ + i] = v[i];
      for (size_t i = n_ - 1; i > 0; --i) t_[i] = std::min(t_[2 * i], t_[2 * i + 1]);
    }
    void Set(size_t i, double v) {
      for (t_[i += n_] = v; i > 1; i /= 2) t_[i / 2] = std::min(t_[i], t_[i ^ 1]);
    }
    // The first index >= from whose value is <= limit, or SIZE_MAX.
    size_t First(size_t from, double limit) const { return Find(1, 0, n_, from, limit); }

   private:
    size_t Find(size_t node, size_t lo, size_t hi, size_t from, double limit) const {
      if (hi <= from || t_[node] > limit) return SIZE_MAX;
      if (hi - lo == 1) return lo;
      const size_t mid = (lo + hi) / 2;
      const size_t left = Find(2 * node, lo, mid, from, limit);
      return left != SIZE_MAX ? left : Find(2 * node + 1, mid, hi, from, limit);
    }
    size_t n_;
    std::vector<double> t_;
  };

  // First fit decreasing into ranks of capacity `cap` (over the base load);
  // false when some sample fits no rank.
  static bool FirstFit(const PackProblem& p, absl::Span<const PackItem> items, uint32_t seqs,
                       bool vit, const std::vector<uint32_t>& order,
                       const std::vector<double>& base, double cap, uint32_t* slot) {
    Sequences s(p, seqs);
    std::vector<double> load = base;
    MinTree tree(load);
    for (uint32_t i : order) {
      const double k = Key(items[i], vit);
      bool placed = false;
      for (size_t r = tree.First(0, cap - k); r != SIZE_MAX && !placed;
           r = tree.First(r + 1, cap - k)) {
        const int q = s.Fit(static_cast<uint32_t>(r), items[i]);
        if (q < 0) continue;
        load[r] += k;
        tree.Set(r, load[r]);
        slot[i] = s.Add(static_cast<uint32_t>(r), q, items[i]);
        placed = true;
      }
      if (!placed) return false;
    }
    return true;
  }

  absl::Status Multipack(const PackProblem& p, absl::Span<const PackItem> items, uint32_t seqs,
                         bool vit, absl::string_view modality, const std::vector<double>& base,
                         uint32_t* slot) const {
    const std::vector<uint32_t> order = Decreasing(items, vit);
    double total = 0, largest = 0, base_max = 0;
    for (const PackItem& it : items) {
      total += Key(it, vit);
      largest = std::max(largest, Key(it, vit));
    }
    for (double b : base) {
      total += b;
      base_max = std::max(base_max, b);
    }
    double lo = std::max({total / p.ranks, largest, base_max}), hi = base_max + total;
    if (!FirstFit(p, items, seqs, vit, order, base, hi, slot)) {
      return NoRoom(p, modality, items, seqs, name_);
    }
    std::vector<uint32_t> best(slot, slot + items.size());
    for (int iter = 0; iter < 40 && hi - lo > 1e-6 * hi; ++iter) {
      const double mid = (lo + hi) / 2;
      if (FirstFit(p, items, seqs, vit, order, base, mid, slot)) {
        hi = mid;
        best.assign(slot, slot + items.size());
      } else {
        lo = mid;
      }
    }
    std::copy(best.begin(), best.end(), slot);
    return absl::OkStatus();
  }

  std::string name_;
  Peer peer_;
};

}  // namespace

std::unique_ptr<PackingStrategy> MakePeerStrategy(const std::string& name) {
  if (name == "lpt") return std::make_unique<PeerStrategy>(name, Peer::kLpt);
  if (name == "kk") return std::make_unique<PeerStrategy>(name, Peer::kKk);
  if (name == "multipack") return std::make_unique<PeerStrategy>(name, Peer::kMultipack);
  if (name == "sequential") return std::make_unique<PeerStrategy>(name, Peer::kSequential);
  return nullptr;
}

}  // namespace tutti::packer
