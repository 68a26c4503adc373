// The "tutti" strategy: minimises the slowest rank's cost in each phase,
// the ViT cost (pre-balancing) and the LLM cost, with tokens only as the
// constraint of every sequence (seq_len, and img_cap for image tokens).
//
//   1. Large text documents (LLM cost at least kGiant of the LLM lower
//      bound max(mean, largest item)) first, longest processing time (LPT):
//      by decreasing LLM cost onto the rank with the least LLM cost that has
//      a text sequence with room. Only with VL samples to balance: they then
//      keep off these ranks beyond the bound (plus kGiantSlack), so that a
//      large document never shares its rank with a full VL share.
//   2. VL samples, LPT by ViT cost (by LLM cost when the encoders are dealt
//      elsewhere, balance_vit false) onto the allowed rank with the least
//      load and a VL sequence with room (samples under kSmall of a rank's
//      mean load in batches, as in step 3); then the ViT search (pair
//      passes and rounds, below) with the LLM budget of step 1 as the cap.
//   3. The other text documents, LPT by LLM cost on top of the VL samples'
//      LLM cost; documents under kSmall of a rank's mean load go in batches
//      (the B largest onto the B least loaded ranks), which is LPT up to the
//      order within a batch without a heap operation per document.
//   4. Local search, bounded: the best move of one of a slow rank's
//      samples, or swap with a sample of a fast rank, that brings both
//      ranks below the slow one's cost and raises no rank of the other
//      phase above that phase's maximum (a ViT change may take a text
//      document along to keep the LLM maximum). So neither phase ever gets
//      worse. First up to kPairPasses pair passes (of the ViT phase in
//      step 2, of the LLM phase here): the k-th slowest rank with the k-th
//      fastest, k = 0, 1, ..., which evens out many ranks at once (a round
//      fixes one); then rounds, each from the slowest rank of a phase to
//      the least loaded ranks (kReceivers of them; in the ViT phase
//      kWideReceivers when none of those takes a change: at a low
//      max-pixel stage the ranks with the least ViT cost are often those
//      whose VL sequences are full; when those take none either, the best
//      division of two ranks' VL samples in every way: Resplit),
//      alternating between the phases (LLM, then
//      ViT) until neither can improve, the maximum sits within kDone of its
//      lower bound, the last kStallRounds rounds of a phase lowered it by
//      less than kStall of its bound, or the budget (Budget(), passes
//      charged to it) is spent. Every stop is counted in rounds and pairs,
//      never in time, so plans do not depend on the machine.
//   5. Up to kSeededUpTo ranks (where a plan costs a few milliseconds),
//      and at any W when neither order of step 2 fits the VL samples into
//      their sequences, steps 2-4 again with the VL deal of step 2 taken
//      from Karmarkar-Karp's and from LPT's partition of the VL samples by
//      ViT cost (placed by decreasing tokens; a sample whose part's rank
//      has no room, or holds a large document beyond the budget, goes to
//      the least loaded rank that takes it), and the plan whose slower
//      phase (maximum over its bound, counted from kDone over it) is the
//      fastest is kept; equal ones by the sum of both, then the earlier.
//      The search never makes a phase worse, so where every sample keeps
//      its part's rank a seeded plan's ViT maximum is at most the peer's.
//      Small worlds hold few VL samples per rank, where a partition's
//      differencing finds combinations the ViT search's single moves and
//      swaps cannot reach.
//   6. When none of these fits the samples into their sequences (a step
//      filled to within a sample of its room), first-fit decreasing by
//      tokens places them (admission admits only what it packs,
//      overflow.h) and step 4 evens out both phases from there, so that
//      such a step is balanced rather than left at first fit's placement.
// Within a rank a sample goes to the sequence of its modality with the fewest
// tokens that has room for its tokens and image tokens. Ranks without room
// for the next sample sleep until the samples get small enough (the choice
// is unchanged, the scan shorter). Deterministic: orders break ties by
// position, heaps by rank.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "services/packer/core/overflow.h"
#include "services/packer/core/packing.h"
#include "services/packer/core/radix_sort.h"
#include "services/packer/core/rank_heap.h"

namespace tutti::packer {
namespace {

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
// Up to this many ranks, the plan is also searched from each of these
// peers' VL deals (Pack).
constexpr uint32_t kSeededUpTo = 256;
constexpr const char* kSeeds[] = {"kk", "lpt"};

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
double Max(const State& st, bool vit_phase) {
  return vit_phase ? st.vit[st.vit_max.Top()] : st.llm[st.llm_max.Top()];
}

class TuttiStrategy final : public PackingStrategy {
 public:
  explicit TuttiStrategy(uint32_t rounds) : rounds_(rounds) {
    for (const char* name : kSeeds) seeds_.push_back(MakePeerStrategy(name));
  }
  const std::string& name() const override { return name_; }

  absl::Status Pack(const PackProblem& p, PackResult* out) const override {
    Score score;
    const absl::Status first = PackFrom(p, nullptr, nullptr, out, &score);
    if (!first.ok() && !absl::IsFailedPrecondition(first)) return first;
    bool have = first.ok();
    // Small worlds, and a step whose VL samples neither order fits: steps
    // 2-4 again from each peer's VL deal (step 5).
    if (p.ranks >= 2 && (!first.ok() || p.ranks <= kSeededUpTo) && p.balance_vit &&
        p.vl.size() >= 2) {
      Seed(p, out, &score, &have);
    }
    if (have) return absl::OkStatus();
    // Nothing above fits the samples into their sequences: first-fit
    // decreasing by tokens (what admission guarantees to pack, overflow.h),
    // then the search from there (step 6).
    thread_local PackResult fitted;
    if (!first_fit_->Pack(p, &fitted).ok()) return first;
    return PackFrom(p, nullptr, &fitted, out, &score).ok() ? absl::OkStatus() : first;
  }

 private:
  // Step 5: steps 2-4 from each of kSeeds' VL deals, keeping the plan with
  // the better Score in *out (*have: whether *out holds a plan).
  void Seed(const PackProblem& p, PackResult* out, Score* score, bool* have) const {
    PackProblem vl_only = p;
    vl_only.text = {};
    vl_only.text_lead = {};
    thread_local PackResult seed, alt;
    thread_local std::vector<uint32_t> rank;
    for (const std::unique_ptr<PackingStrategy>& peer : seeds_) {
      if (!peer->Pack(vl_only, &seed).ok()) continue;
      rank.resize(p.vl.size());
      for (size_t i = 0; i < rank.size(); ++i) rank[i] = seed.vl_slot[i] / p.vl_seqs_per_rank;
      Score alt_score;
      if (!PackFrom(p, &rank, nullptr, &alt, &alt_score).ok() ||
          (*have && !alt_score.Better(*score))) {
        continue;
      }
      std::swap(*out, alt);
      *score = alt_score;
      *have = true;
    }
  }

  // Steps 1-4: the plan, its VL samples dealt from `vl_rank` (a rank per
  // sample) when given, else by ViT cost; or, with `placed`, step 4 alone
  // from that placement of every sample. `score`: both phases' maxima over
  // their lower bounds (the ViT one 0 when not balanced).
  absl::Status PackFrom(const PackProblem& p, const std::vector<uint32_t>* vl_rank,
                        const PackResult* placed, PackResult* out, Score* score) const {
    thread_local State st;
    const uint32_t W = p.ranks;
    for (auto* v : {&st.vit, &st.llm, &st.key, &st.neg_vit, &st.neg_llm}) v->assign(W, 0.0);
    out->text_slot.assign(p.text.size(), 0);
    out->vl_slot.assign(p.vl.size(), 0);
    Side& text = st.text;
    Side& vl = st.vl;
    text.items = p.text;
    text.slot = &out->text_slot;
    text.vl = false;
    text.rooms.Init(W, p.text_seqs_per_rank, p.seq_len, 0);
    vl.items = p.vl;
    vl.slot = &out->vl_slot;
    vl.vl = true;
    vl.rooms.Init(W, p.vl_seqs_per_rank, p.seq_len, p.img_cap);
    st.text_placed = false;
    Bounds(p, &st);
    const uint64_t budget = Budget(W);
    uint64_t vit_rounds = 0, llm_rounds = 0;
    auto anywhere = [](uint32_t, const PackItem&) { return true; };
    auto nothing = [](uint32_t, const PackItem&) {};

    if (placed != nullptr) {
      // Every sample where `placed` puts it; only the search (step 4) runs.
      *out = *placed;
      for (uint32_t i = 0; i < p.text.size(); ++i) {
        text.rooms.Add(out->text_slot[i], p.text[i]);
        st.llm[text.RankOf(i)] += p.text[i].llm;
      }
      for (uint32_t i = 0; i < p.vl.size(); ++i) {
        vl.rooms.Add(out->vl_slot[i], p.vl[i]);
        st.llm[vl.RankOf(i)] += p.vl[i].llm;
        st.vit[vl.RankOf(i)] += p.vl[i].vit;
      }
      st.text_placed = true;
    } else {
      // 1. Text documents large against the LLM lower bound claim their
      // ranks first (pre-balancing: VL samples then avoid those ranks).
      const bool giants = p.balance_vit && !p.vl.empty();
      const double giant = giants ? kGiant * st.llm_lb : HUGE_VAL;
      std::vector<uint8_t>& holds_giant = st.holds_giant;
      holds_giant.assign(W, 0);
      if (giants) {
        Order(
            text, LlmOf(), [&](const PackItem& it) { return it.llm >= giant; }, &st);
        RETURN_IF_ERROR(Lpt(p, &st, &text, LlmOf(), &st.llm, anywhere,
                            [&](uint32_t r, const PackItem&) { holds_giant[r] = 1; }));
      }
      // 2. VL samples by ViT cost (by LLM cost when the encoders are dealt
      // elsewhere), onto ranks whose large documents leave them LLM room,
      // then the ViT search among VL samples alone.
      if (!p.vl.empty()) {
        auto all = [](const PackItem&) { return true; };
        if (vl_rank != nullptr) {
          Order(vl, TokensOf(), all, &st);  // the ranks are given: fit first
        } else if (p.balance_vit) {
          Order(vl, VitOf(), all, &st);
        } else {
          Order(vl, LlmOf(), all, &st);
        }
        std::vector<double>& vl_load = st.scratch;
        vl_load.assign(W, 0.0);
        const double room = st.llm_budget;
        auto allowed = [&](uint32_t r, const PackItem& it) {
          return !holds_giant[r] || st.llm[r] + it.llm <= room;
        };
        auto add_loads = [&](uint32_t r, const PackItem& it) {
          st.llm[r] += it.llm;
          st.vit[r] += it.vit;
        };
        absl::Status s = vl_rank != nullptr ? Seeded(p, &st, *vl_rank, allowed, add_loads)
                         : p.balance_vit ? Lpt(p, &st, &vl, VitOf(), &vl_load, allowed, add_loads)
                                         : Lpt(p, &st, &vl, LlmOf(), &vl_load, allowed, add_loads);
        if (absl::IsFailedPrecondition(s)) {
          // VL sequences too tight for cost order (it strands room a large
          // sample needs): again by tokens, largest first onto the rank with
          // the fewest VL tokens, which packs what fits; the ViT search below
          // then evens out the cost.
          vl.rooms.Init(W, p.vl_seqs_per_rank, p.seq_len, p.img_cap);
          vl_load.assign(W, 0.0);
          st.vit.assign(W, 0.0);
          st.llm.assign(W, 0.0);
          for (uint32_t i = 0; i < p.text.size(); ++i) {
            if (p.text[i].llm >= giant) st.llm[text.RankOf(i)] += p.text[i].llm;
          }
          Order(vl, TokensOf(), all, &st);
          s = Lpt(p, &st, &vl, TokensOf(), &vl_load, allowed, add_loads);
        }
        RETURN_IF_ERROR(s);
        if (p.balance_vit && W > 1) {
          StartSearch(p, &st);
          st.llm_cap = st.llm_budget;
          Passes(p, &st, true, budget, &vit_rounds);
          Progress vp;
          while (vit_rounds < budget && vp.Go(Max(st, true), st.vit_lb) && Round(p, &st, true)) {
            ++vit_rounds;
          }
        }
      }
      // 3. The other text documents, on top.
      Order(
          text, LlmOf(), [&](const PackItem& it) { return it.llm < giant; }, &st);
      RETURN_IF_ERROR(Lpt(p, &st, &text, LlmOf(), &st.llm, anywhere, nothing));
      st.text_placed = true;
    }
    // 4. Both phases, alternating.
    if (W > 1) {
      StartSearch(p, &st);
      st.llm_cap = -1;
      const bool vit_open = p.balance_vit && !p.vl.empty();
      Passes(p, &st, false, budget, &llm_rounds);
      Progress llm_progress, vit_progress;
      while (true) {
        bool moved = false;
        while (llm_rounds < budget && llm_progress.Go(Max(st, false), st.llm_lb) &&
               Round(p, &st, false)) {
          ++llm_rounds, moved = true;
        }
        while (vit_open && vit_rounds < budget && vit_progress.Go(Max(st, true), st.vit_lb) &&
               Round(p, &st, true)) {
          ++vit_rounds, moved = true;
        }
        if (!moved) break;
      }
    }
    double vit_max = 0, llm_max = 0;
    for (uint32_t r = 0; r < W; ++r) {
      vit_max = std::max(vit_max, st.vit[r]);
      llm_max = std::max(llm_max, st.llm[r]);
    }
    score->llm = llm_max / st.llm_lb;
    score->vit = p.balance_vit && st.vit_lb > 0 ? vit_max / st.vit_lb : 0.0;
    return absl::OkStatus();
  }

  // The rank with the least load that has a sequence for `it` (its
  // sequence in *q), allowed ranks first; -1 when none has.
  template <typename Allowed>
  static int64_t LeastLoadedTaker(const Rooms& rooms, uint32_t W, const std::vector<double>& load,
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

  // The VL samples of st->order (by decreasing tokens) each onto its rank
  // in `rank` where one of its VL sequences has room and allowed(rank,
  // sample), else onto the rank with the least ViT cost that takes it
  // (allowed ones first).
  template <typename Allowed, typename Placed>
  absl::Status Seeded(const PackProblem& p, State* st, const std::vector<uint32_t>& rank,
                      Allowed allowed, Placed placed) const {
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

  // Lower bounds max(mean, largest item) of both phases, and the LLM
  // budget of ranks holding a large document.
  static void Bounds(const PackProblem& p, State* st) {
    double vit_lb = 0, llm_lb = 0, vit_sum = 0, llm_sum = 0;
    for (const PackItem& it : p.text) {
      llm_sum += it.llm;
      llm_lb = std::max(llm_lb, it.llm);
    }
    for (const PackItem& it : p.vl) {
      llm_sum += it.llm;
      llm_lb = std::max(llm_lb, it.llm);
      vit_sum += it.vit;
      vit_lb = std::max(vit_lb, it.vit);
    }
    st->vit_lb = std::max(vit_lb, vit_sum / p.ranks);
    st->llm_lb = std::max(llm_lb, llm_sum / p.ranks);
    st->llm_budget = st->llm_lb * (1 + kGiantSlack);
  }

  // The items of `side` by decreasing key (ties: lower item) into
  // st->order, optionally only those with select(item). Keys are compared
  // as floats (a relative 6e-8; closer keys count as equal).
  template <typename Key, typename Select>
  static void Order(const Side& side, Key key, Select select, State* st) {
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

  // Places the items of st->order, in order, each onto the rank with the
  // least load that has room for it (ties: lower rank), adding key(item) to
  // the load and calling placed(rank, item). Ranks where allowed(rank,
  // item) is false are passed over unless no allowed rank has room.
  template <typename Key, typename Allowed, typename Placed>
  absl::Status Lpt(const PackProblem& p, State* st, Side* side, Key key, std::vector<double>* load,
                   Allowed allowed, Placed placed) const {
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

  // A candidate change: item i of `from` to `to`, and item j (or none) of
  // `to` back to `from`.
  static absl::Status NoRoom(const PackProblem& p, const Side& side, const PackItem& it) {
    uint64_t tokens = 0;
    for (const PackItem& x : side.items) tokens += x.tokens;
    const bool cap = side.vl && p.img_cap > 0;
    return CapacityError(
        side.vl ? "VL" : "text", tokens, p.ranks, side.rooms.per(), p.seq_len,
        absl::StrCat("no sequence has room left for a sample of ", it.tokens, " tokens",
                     cap ? absl::StrCat(" and ", it.image_tokens, " image tokens") : ""));
  }

  // The items st->order[from...] (small ones) in batches: the B largest go
  // to the B least loaded ranks, largest to least loaded, then the ranks
  // are ranked again. LPT up to the order within a batch, without a heap
  // operation per item. An item its rank has no room for (or is not
  // allowed on) goes to the least loaded rank that takes it.
  template <typename Key, typename Allowed, typename Placed>
  absl::Status LptBatches(const PackProblem& p, State* st, Side* side, Key key,
                          std::vector<double>* load, Allowed allowed, Placed placed,
                          size_t from) const {
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
  static int64_t Compensation(const Side& text, uint32_t src, uint32_t dst, double need,
                              double room) {
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
  static bool WithinCap(const Side* comp, uint32_t a, double a_cost, uint32_t b, double b_cost,
                        double cap, int64_t* t, uint32_t* t_to) {
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
  static void Best(Side& side, uint32_t hi, uint32_t lo, const std::vector<double>& load, Key key,
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

  // Applies a change found by Best and updates loads and heaps.
  static void Apply(const Change& c, uint32_t from, State* st) {
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

  // Rank r's place in the LLM heaps, and in the ViT heaps too when `vit`,
  // after its loads changed.
  static void Reheap(uint32_t r, bool vit, State* st) {
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
  static void MoveText(uint32_t t, uint32_t to, State* st) {
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

  // What a change in one phase may raise the other phase to: its maximum
  // (or, before the text documents are placed, the LLM budget), and at
  // least the point where its own search would stop (kDone over its bound).
  static double OtherCap(const State& st, bool vit_phase) {
    if (vit_phase) {
      return st.llm_cap >= 0 ? st.llm_cap
                             : std::max(st.llm[st.llm_max.Top()], st.llm_lb * (1 + kDone));
    }
    return std::max(st.vit[st.vit_max.Top()], st.vit_lb * (1 + kDone));
  }

  // One round of a phase: the best change off its slowest rank. False when
  // there is none (or the phase sits on its lower bound).
  bool Round(const PackProblem& p, State* st, bool vit_phase) const {
    if (RoundWith(p, st, vit_phase, kReceivers)) return true;
    if (!vit_phase) return false;
    return (p.ranks > kReceivers && RoundWith(p, st, vit_phase, kWideReceivers)) || Resplit(st);
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
  bool Resplit(State* st) const {
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

  // Resplit for the rank hi: the best division of its VL samples with one
  // of the kWideReceivers least loaded ranks that brings both below hi's
  // ViT cost, applied. False when there is none.
  bool ResplitRank(State* st, uint32_t hi, uint32_t width) const {
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
      const double llm_base_hi = st->llm[hi] - llm_hi,
                   llm_base_lo = st->llm[lo] - (llm_all - llm_hi);
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

  bool RoundWith(const PackProblem& p, State* st, bool vit_phase, uint32_t width) const {
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

  // Up to kPairPasses pair passes of a phase while they move something,
  // charged to its round budget: one round per 2 * kReceivers pairs tried
  // (the receivers a ViT round tries).
  void Passes(const PackProblem& p, State* st, bool vit_phase, uint64_t budget,
              uint64_t* rounds) const {
    for (int pass = 0; pass < kPairPasses && *rounds < budget; ++pass) {
      st->pair_tries = 0;
      const bool moved = PairPass(p, st, vit_phase);
      *rounds += (st->pair_tries + 2 * kReceivers - 1) / (2 * kReceivers);
      if (!moved) break;
    }
  }

  // One pass pairing the k-th slowest rank of a phase with the k-th
  // fastest, k = 0, 1, ... while the slower one is above kDone over the
  // bound: the best change between the two (as a round with that one
  // receiver); a slow rank with no change tries the next fast ones (up to
  // kPairTriesVit / kPairTriesLlm in all). A fast rank takes at most one
  // change a pass. Evens out many ranks for one partner search per pair.
  // False when nothing moved.
  bool PairPass(const PackProblem& p, State* st, bool vit_phase) const {
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

  // Per-rank lists of the placed samples and the four heaps of the search.
  static void StartSearch(const PackProblem& p, State* st) {
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

  // Local-search rounds per phase: improvement_rounds, times the square
  // root of the number of 64-rank groups (a round moves one sample off the
  // slowest rank, and larger worlds have more slowest ranks to even out).
  uint64_t Budget(uint32_t W) const {
    const double groups = std::ceil(W / 64.0);
    return static_cast<uint64_t>(rounds_ * std::ceil(std::sqrt(groups)));
  }

  const std::string name_ = "tutti";
  uint32_t rounds_;
  std::vector<std::unique_ptr<PackingStrategy>> seeds_;                  // kSeeds
  std::unique_ptr<PackingStrategy> first_fit_ = MakeFirstFitStrategy();  // step 6
};

}  // namespace

std::unique_ptr<PackingStrategy> MakeTuttiStrategy(uint32_t improvement_rounds) {
  return std::make_unique<TuttiStrategy>(improvement_rounds);
}

}  // namespace tutti::packer
