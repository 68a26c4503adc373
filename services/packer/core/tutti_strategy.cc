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
#include "services/packer/core/tutti_place.h"
#include "services/packer/core/tutti_search.h"
#include "services/packer/core/tutti_state.h"

namespace tutti::packer::tutti_internal {
namespace {

// Up to this many ranks, the plan is also searched from each of these
// peers' VL deals (Pack).
constexpr uint32_t kSeededUpTo = 256;
constexpr const char* kSeeds[] = {"kk", "lpt"};

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
}  // namespace tutti::packer::tutti_internal

namespace tutti::packer {

std::unique_ptr<PackingStrategy> MakeTuttiStrategy(uint32_t improvement_rounds) {
  return std::make_unique<tutti_internal::TuttiStrategy>(improvement_rounds);
}

}  // namespace tutti::packer
