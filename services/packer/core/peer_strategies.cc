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
// Without balance_vit (a post-balancing re-deal's LLM phase, where ViT cost
// is dealt apart) there is one cost to balance: every peer deals the text
// and VL samples in one list by LLM cost, each into a sequence of its own
// modality (kk and sequential then fill each modality's sequences as above).
//
// A rank takes a sample when one of its sequences of the sample's modality
// has room for its tokens (and image tokens under img_cap). Deterministic:
// every order breaks ties by position.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "services/packer/core/multiway_partition.h"
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
  // The most free tokens and the most free image tokens (under img_cap) of
  // any of rank r's sequences.
  void Room(uint32_t r, uint32_t* tokens, uint32_t* images) const {
    *tokens = *images = 0;
    for (uint32_t q = 0; q < seqs_; ++q) {
      const size_t k = size_t{r} * seqs_ + q;
      *tokens = std::max(*tokens, seq_len_ - std::min(seq_len_, tokens_[k]));
      if (img_cap_ > 0) *images = std::max(*images, img_cap_ - std::min(img_cap_, images_[k]));
    }
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
  return DecreasingOrder(static_cast<uint32_t>(items.size()),
                         [&](uint32_t i) { return Key(items[i], vit); });
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
    if (!p.balance_vit) return PackOneList(p, out);
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
    int q = -1;
    const int64_t failed = LptPlace(
        Decreasing(items, vit), load, [&](uint32_t i) { return Key(items[i], vit); },
        [&](uint32_t r, uint32_t i) { return (q = s.Fit(r, items[i])) >= 0; },
        [&](uint32_t r, uint32_t i) { slot[i] = s.Add(r, q, items[i]); });
    return failed >= 0 ? NoRoom(p, modality, items, seqs, name_) : absl::OkStatus();
  }

  // Largest differencing: every sample starts as a W-way partition with one
  // non-empty part; the two partitions with the largest spread are merged,
  // heaviest part with lightest, until one is left.
  absl::Status Kk(const PackProblem& p, absl::Span<const PackItem> items, uint32_t seqs, bool vit,
                  absl::string_view modality, const std::vector<double>& base,
                  uint32_t* slot) const {
    const std::vector<uint32_t> rank = KkRanks(p.ranks, items, vit, base);
    return FillRanks(p, items, seqs, rank, vit, base, modality, name_, slot);
  }

  // The ranks of Karmarkar-Karp's partition of the items by key, the
  // heaviest part onto the rank with the least base load.
  static std::vector<uint32_t> KkRanks(uint32_t W, absl::Span<const PackItem> items, bool vit,
                                       const std::vector<double>& base) {
    std::vector<double> keys(items.size());
    for (uint32_t i = 0; i < items.size(); ++i) keys[i] = Key(items[i], vit);
    std::vector<uint32_t> rank = KarmarkarKarpPartition(keys, W);
    // Heaviest part onto the rank with the least load so far.
    std::vector<uint32_t> ranks(W);
    std::iota(ranks.begin(), ranks.end(), 0u);
    std::stable_sort(ranks.begin(), ranks.end(),
                     [&](uint32_t l, uint32_t r) { return base[l] < base[r]; });
    for (uint32_t& r : rank) r = ranks[r];
    return rank;
  }

  // Over rank ranges: the least load and the most room any one sequence has
  // (tokens, image tokens), to find the first rank that can take an item
  // fast: a range whose least load is above the limit, or none of whose
  // sequences has the room, holds no such rank.
  class RankTree {
   public:
    RankTree(const std::vector<double>& load, uint32_t room, uint32_t image_room) : n_(1) {
      while (n_ < load.size()) n_ *= 2;
      load_.assign(2 * n_, std::numeric_limits<double>::infinity());
      room_.assign(2 * n_, 0);
      image_room_.assign(2 * n_, 0);
      for (size_t i = 0; i < load.size(); ++i) {
        load_[n_ + i] = load[i];
        room_[n_ + i] = room;
        image_room_[n_ + i] = image_room;
      }
      for (size_t i = n_ - 1; i > 0; --i) Pull(i);
    }
    void Set(size_t i, double load, uint32_t room, uint32_t image_room) {
      i += n_;
      load_[i] = load;
      room_[i] = room;
      image_room_[i] = image_room;
      for (i /= 2; i > 0; i /= 2) Pull(i);
    }
    // The first rank >= from whose load is <= limit and that may have a
    // sequence with room for (tokens, images), or SIZE_MAX.
    size_t First(size_t from, double limit, uint32_t tokens, uint32_t images) const {
      return Find(1, 0, n_, from, limit, tokens, images);
    }

   private:
    void Pull(size_t i) {
      load_[i] = std::min(load_[2 * i], load_[2 * i + 1]);
      room_[i] = std::max(room_[2 * i], room_[2 * i + 1]);
      image_room_[i] = std::max(image_room_[2 * i], image_room_[2 * i + 1]);
    }
    size_t Find(size_t node, size_t lo, size_t hi, size_t from, double limit, uint32_t tokens,
                uint32_t images) const {
      if (hi <= from || load_[node] > limit || room_[node] < tokens || image_room_[node] < images) {
        return SIZE_MAX;
      }
      if (hi - lo == 1) return lo;
      const size_t mid = (lo + hi) / 2;
      const size_t left = Find(2 * node, lo, mid, from, limit, tokens, images);
      return left != SIZE_MAX ? left : Find(2 * node + 1, mid, hi, from, limit, tokens, images);
    }
    size_t n_;
    std::vector<double> load_;
    std::vector<uint32_t> room_, image_room_;
  };

  // First fit decreasing into ranks of capacity `cap` (over the base load);
  // false when some sample fits no rank.
  static bool FirstFit(const PackProblem& p, absl::Span<const PackItem> items, uint32_t seqs,
                       bool vit, const std::vector<uint32_t>& order,
                       const std::vector<double>& base, double cap, uint32_t* slot) {
    Sequences s(p, seqs);
    std::vector<double> load = base;
    const uint32_t image_cap = p.img_cap > 0 ? p.img_cap : UINT32_MAX;
    RankTree tree(load, p.seq_len, image_cap);
    for (uint32_t i : order) {
      const double k = Key(items[i], vit);
      const uint32_t images = p.img_cap > 0 ? items[i].image_tokens : 0;
      bool placed = false;
      for (size_t r = tree.First(0, cap - k, items[i].tokens, images); r != SIZE_MAX && !placed;
           r = tree.First(r + 1, cap - k, items[i].tokens, images)) {
        const int q = s.Fit(static_cast<uint32_t>(r), items[i]);
        if (q < 0) continue;
        load[r] += k;
        slot[i] = s.Add(static_cast<uint32_t>(r), q, items[i]);
        uint32_t room = 0, image_room = 0;
        s.Room(static_cast<uint32_t>(r), &room, &image_room);
        tree.Set(r, load[r], room, p.img_cap > 0 ? image_room : UINT32_MAX);
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

  // One list (no balance_vit): the text samples, then the VL samples, as
  // one item list; `vl` tells a VL item.
  struct OneList {
    std::vector<PackItem> items;
    std::vector<uint8_t> vl;
    size_t text = 0;  // items[0, text) are the text samples
  };

  // Writes item i's slot (rank * seqs + sequence within its modality).
  static void SetSlot(const OneList& l, size_t i, uint32_t slot, PackResult* out) {
    (i < l.text ? out->text_slot[i] : out->vl_slot[i - l.text]) = slot;
  }

  // Fills each modality's sequences with the samples `rank` gives them (as
  // FillRanks), VL first with the text loads as the base, then text with the
  // VL loads.
  absl::Status FillBoth(const PackProblem& p, const OneList& l, const std::vector<uint32_t>& rank,
                        PackResult* out) const {
    const size_t T = l.text;
    std::vector<double> text_load(p.ranks, 0.0), vl_load(p.ranks, 0.0);
    for (size_t i = 0; i < T; ++i) text_load[rank[i]] += l.items[i].llm;
    const std::vector<uint32_t> vl_rank(rank.begin() + T, rank.end());
    RETURN_IF_ERROR(FillRanks(p, p.vl, p.vl_seqs_per_rank, vl_rank, false, text_load, "VL", name_,
                              out->vl_slot.data()));
    for (size_t i = 0; i < p.vl.size(); ++i) {
      vl_load[out->vl_slot[i] / p.vl_seqs_per_rank] += p.vl[i].llm;
    }
    const std::vector<uint32_t> text_rank(rank.begin(), rank.begin() + T);
    return FillRanks(p, p.text, p.text_seqs_per_rank, text_rank, false, vl_load, "text", name_,
                     out->text_slot.data());
  }

  absl::Status PackOneList(const PackProblem& p, PackResult* out) const {
    OneList l;
    l.text = p.text.size();
    l.items.assign(p.text.begin(), p.text.end());
    l.items.insert(l.items.end(), p.vl.begin(), p.vl.end());
    l.vl.assign(l.items.size(), 1);
    std::fill(l.vl.begin(), l.vl.begin() + l.text, 0);
    if (l.items.empty()) return absl::OkStatus();
    switch (peer_) {
      case Peer::kLpt:
        return LptOneList(p, l, out);
      case Peer::kKk:
        return FillBoth(p, l, KkRanks(p.ranks, l.items, false, std::vector<double>(p.ranks, 0.0)),
                        out);
      case Peer::kMultipack:
        return MultipackOneList(p, l, out);
      case Peer::kSequential: {
        std::vector<uint32_t> rank(l.items.size());
        for (uint32_t i = 0; i < rank.size(); ++i) rank[i] = i % p.ranks;
        return FillBoth(p, l, rank, out);
      }
    }
    return absl::OkStatus();
  }

  absl::Status NoRoomOneList(const PackProblem& p, const OneList& l, size_t i) const {
    return i < l.text ? NoRoom(p, "text", p.text, p.text_seqs_per_rank, name_)
                      : NoRoom(p, "VL", p.vl, p.vl_seqs_per_rank, name_);
  }

  absl::Status LptOneList(const PackProblem& p, const OneList& l, PackResult* out) const {
    Sequences seqs[2] = {Sequences(p, p.text_seqs_per_rank), Sequences(p, p.vl_seqs_per_rank)};
    std::vector<double> load(p.ranks, 0.0);
    int q = -1;
    const std::vector<uint32_t> order = Decreasing(l.items, false);
    const int64_t failed = LptPlace(
        order, &load, [&](uint32_t i) { return l.items[i].llm; },
        [&](uint32_t r, uint32_t i) { return (q = seqs[l.vl[i]].Fit(r, l.items[i])) >= 0; },
        [&](uint32_t r, uint32_t i) { SetSlot(l, i, seqs[l.vl[i]].Add(r, q, l.items[i]), out); });
    return failed >= 0 ? NoRoomOneList(p, l, order[failed]) : absl::OkStatus();
  }

  // First fit decreasing of both modalities into ranks of capacity `cap`,
  // each item into a sequence of its modality; false when one fits nowhere.
  static bool FirstFitOneList(const PackProblem& p, const OneList& l,
                              const std::vector<uint32_t>& order, double cap, PackResult* out) {
    Sequences seqs[2] = {Sequences(p, p.text_seqs_per_rank), Sequences(p, p.vl_seqs_per_rank)};
    std::vector<double> load(p.ranks, 0.0);
    const uint32_t image_cap = p.img_cap > 0 ? p.img_cap : UINT32_MAX;
    RankTree trees[2] = {RankTree(load, p.text_seqs_per_rank > 0 ? p.seq_len : 0, UINT32_MAX),
                         RankTree(load, p.vl_seqs_per_rank > 0 ? p.seq_len : 0, image_cap)};
    uint32_t rooms[2][2];  // per modality: the rank's largest token and image room
    for (uint32_t i : order) {
      const PackItem& it = l.items[i];
      const int m = l.vl[i];
      const uint32_t images = m && p.img_cap > 0 ? it.image_tokens : 0;
      bool placed = false;
      for (size_t r = trees[m].First(0, cap - it.llm, it.tokens, images); r != SIZE_MAX && !placed;
           r = trees[m].First(r + 1, cap - it.llm, it.tokens, images)) {
        const uint32_t rank = static_cast<uint32_t>(r);
        const int q = seqs[m].Fit(rank, it);
        if (q < 0) continue;
        load[r] += it.llm;
        SetSlot(l, i, seqs[m].Add(rank, q, it), out);
        for (int k = 0; k < 2; ++k) {
          seqs[k].Room(rank, &rooms[k][0], &rooms[k][1]);
          trees[k].Set(r, load[r], rooms[k][0], k == 1 && p.img_cap > 0 ? rooms[k][1] : UINT32_MAX);
        }
        placed = true;
      }
      if (!placed) return false;
    }
    return true;
  }

  absl::Status MultipackOneList(const PackProblem& p, const OneList& l, PackResult* out) const {
    const std::vector<uint32_t> order = Decreasing(l.items, false);
    double total = 0, largest = 0;
    for (const PackItem& it : l.items) {
      total += it.llm;
      largest = std::max(largest, it.llm);
    }
    double lo = std::max(total / p.ranks, largest), hi = total;
    if (!FirstFitOneList(p, l, order, hi, out)) return NoRoomOneList(p, l, order.front());
    PackResult best = *out;
    for (int iter = 0; iter < 40 && hi - lo > 1e-6 * hi; ++iter) {
      const double mid = (lo + hi) / 2;
      if (FirstFitOneList(p, l, order, mid, out)) {
        hi = mid;
        best = *out;
      } else {
        lo = mid;
      }
    }
    *out = std::move(best);
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
