// Internal to the LLM phase (llm_phase.cc, llm_placer.cc): the placement
// state shared by the greedy passes and the local searches of the balancer
// and of the node-aware rearrangement. Not part of the library's API.
// Not thread-safe; one planner thread owns a Placer.
#ifndef TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_LLM_PLACER_H_
#define TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_LLM_PLACER_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <queue>
#include <set>
#include <utility>
#include <vector>

#include "common/cost_model.h"
#include "services/packer/core/post_balancing/llm_phase.h"
#include "services/packer/core/post_balancing/min_tree.h"
#include "services/packer/core/post_balancing/sequence_state.h"

namespace tutti::dispatch::internal {

constexpr uint32_t kUnplaced = ~0u;
constexpr double kRelSlack = 1e-9;
// Steps with at most this many documents also try the pinned-first greedy.
constexpr size_t kPortfolioDocs = 20000;
// Steps with at most this many documents and ranks also try, in the
// locality search, a move beyond the bound repaired by byte-neutral moves
// (each repair looks at every rank).
constexpr size_t kRepairDocs = 4000;
constexpr uint32_t kRepairRanks = 64;
// Ranks whose share of the search a pass that buys balance with bytes may
// spend (ImproveBalance with ByteRule::kFewest: rounds x min(W, this) steps).
constexpr uint32_t kFewestBytesRanks = 128;

inline bool Within(double cost, double bound) {
  return cost <= bound + kRelSlack * std::abs(bound);
}

// Docs by decreasing tokens (hence decreasing cost), ties by index.
std::vector<uint32_t> LptOrder(const std::vector<LlmDoc>& docs);

// Placement state shared by the greedy passes and the local searches.
class Placer {
 public:
  explicit Placer(const LlmProblem& p)
      : p_(p),
        model_(p.cost),
        state_(p.cluster, p.slots, model_, p.padded),
        members_(p.cluster.world_size),
        rank_(p.docs.size(), kUnplaced),
        seq_(p.docs.size(), 0),
        pos_(p.docs.size(), 0),
        cost_(p.docs.size()),
        trees_{MinTree(&state_.costs()), MinTree(&state_.costs())},
        lower_bound_(LlmLowerBound(p)) {
    for (auto& d : dirty_) d.assign(p.cluster.world_size, 0);
    // Room for a rank's share and some (each list grown doc by doc would be
    // reallocated several times per rank).
    const size_t share = p.docs.size() / std::max<uint32_t>(1, p.cluster.world_size);
    for (auto& m : members_) m.reserve(share + share / 4 + 4);
    for (size_t d = 0; d < p.docs.size(); ++d) {
      cost_[d] = model_.Llm(p.docs[d].tokens);
      smallest_[p.docs[d].vl] = std::min(smallest_[p.docs[d].vl], p.docs[d].tokens);
    }
  }

  void Place(uint32_t d, uint32_t r, uint32_t q) { Place(d, r, q, p_.docs[d], cost_[d]); }
  // The same, with the doc's record and cost at hand.
  void Place(uint32_t d, uint32_t r, uint32_t q, const LlmDoc& doc, double doc_cost) {
    if (logging_) undo_.push_back({d, kUnplaced, 0});
    state_.Add(r, q, doc.tokens, doc_cost, doc.image_tokens);
    rank_[d] = r, seq_[d] = q, pos_[d] = static_cast<uint32_t>(members_[r].size());
    members_[r].push_back(d);
    Touch(r);
  }
  void Unplace(uint32_t d) {
    const uint32_t r = rank_[d];
    if (logging_) undo_.push_back({d, r, seq_[d]});
    state_.Remove(r, seq_[d], p_.docs[d].tokens, cost_[d], p_.docs[d].image_tokens);
    auto& m = members_[r];
    const uint32_t last = m.back();
    m[pos_[d]] = last;
    pos_[last] = pos_[d];
    m.pop_back();
    rank_[d] = kUnplaced;
    Touch(r);
  }
  // Moves doc d to sequence q of rank t when e is kUnplaced; otherwise swaps
  // d (to rank t, e's sequence) with e (to rank top, d's sequence).
  void MoveOrSwap(uint32_t d, uint32_t e, uint32_t t, uint32_t q, uint32_t top);

  bool Best(uint32_t r, uint32_t d, uint32_t* q, double* delta) const {
    return state_.BestSequence(r, p_.docs[d].tokens, p_.docs[d].vl, q, delta,
                               p_.docs[d].image_tokens);
  }
  uint64_t Bytes(uint32_t d, uint32_t node) const {
    return p_.affinity.empty() ? 0 : p_.affinity.Bytes(d, node);
  }
  uint32_t node(uint32_t r) const { return p_.cluster.node_of(r); }
  double cost(uint32_t r) const { return state_.cost(r); }
  double doc_cost(uint32_t d) const { return cost_[d]; }

  // Sequences take documents tightly (least room that fits) from now on.
  void set_tight_fit(bool tight) { state_.set_tight_fit(tight); }

  void Flush(int m) {
    for (uint32_t r : dirty_list_[m]) {
      trees_[m].Update(r);
      dirty_[m][r] = 0;
    }
    dirty_list_[m].clear();
  }
  // The least loaded rank with room for any text doc (else any VL doc).
  uint32_t LeastLoaded() {
    Flush(0);
    if (trees_[0].Min() != MinTree::kNone) return trees_[0].Min();
    Flush(1);
    return trees_[1].Min();
  }

  // Lowest-cost rank with room for d (ignoring the bound); kUnplaced if none.
  // For the greedy, which asks in decreasing doc length: a rank found
  // without room for the current length leaves its modality's tree and
  // returns once the length drops to its room (a rank without room even for
  // the modality's smallest doc stays out).
  // `doc` is d's record (the greedy passes a copy read in its order).
  uint32_t LeastLoadedWithRoom(const LlmDoc& doc, uint32_t* q, double* delta) {
    const uint32_t t = doc.tokens;
    const bool vl = doc.vl;
    Flush(vl);
    MinTree& tree = trees_[vl];
    auto& parked = parked_[vl];
    while (!parked.empty() && parked.top().first >= t) {
      const uint32_t r = parked.top().second;
      parked.pop();
      const uint32_t room = state_.room(r, vl);
      if (room >= t) {
        tree.Mask(r, false);
      } else if (room >= smallest_[vl]) {
        parked.push({room, r});
      }
    }
    for (uint32_t r = tree.Min(); r != MinTree::kNone; r = tree.Min()) {
      if (state_.BestSequence(r, t, vl, q, delta, doc.image_tokens)) return r;
      tree.Mask(r, true);
      const uint32_t room = state_.room(r, vl);
      if (room >= smallest_[vl]) parked.push({room, r});
    }
    return kUnplaced;
  }

  // Least loaded rank of `node` that takes d within `bound`.
  uint32_t BestInNode(uint32_t n, uint32_t d, double bound, uint32_t* q, double* delta) const {
    return BestInNode(n, p_.docs[d], bound, q, delta);
  }
  // The same with the doc's record at hand.
  uint32_t BestInNode(uint32_t n, const LlmDoc& doc, double bound, uint32_t* q,
                      double* delta) const {
    uint32_t best = kUnplaced;
    double best_cost = 0;
    const uint32_t first = n * p_.cluster.ranks_per_node;
    for (uint32_t r = first; r < first + p_.cluster.ranks_per_node; ++r) {
      uint32_t rq;
      double rd;
      if (!state_.BestSequence(r, doc.tokens, doc.vl, &rq, &rd, doc.image_tokens) ||
          !Within(cost(r) + rd, bound)) {
        continue;
      }
      if (best == kUnplaced || cost(r) < best_cost) {
        best = r, best_cost = cost(r), *q = rq, *delta = rd;
      }
    }
    return best;
  }

  // Listed nodes of d cheaper than `than`, cheapest first. The result is
  // valid until the next call.
  const std::vector<std::pair<uint64_t, uint32_t>>& CheaperNodes(uint32_t d, uint64_t than) {
    auto& nodes = cheaper_;
    nodes.clear();
    if (p_.affinity.empty()) return nodes;
    for (const auto* e = p_.affinity.begin(d); e != p_.affinity.end(d); ++e) {
      const uint64_t b = p_.affinity.base(d) - e->saved;
      if (b < than) nodes.push_back({b, e->node});
    }
    if (nodes.size() > 1) std::sort(nodes.begin(), nodes.end());
    return nodes;
  }

  // How the greedy orders the docs.
  enum class Order {
    // All docs in LPT order, each to the least loaded rank with room as LPT
    // does; a doc with affinity goes instead to the least loaded rank of its
    // cheapest node if that rank is within `slack` of LPT's choice (slack:
    // half the bound's headroom over the lower bound, or the cost per rank
    // still to place, which later docs even out) and within the bound.
    kLpt,
    // Docs too large to share a rank with much (over half the bound) first,
    // in LPT order; then the docs with affinity by decreasing regret (bytes
    // lost if they miss their cheapest node), each to the least loaded rank
    // of its cheapest node within the bound; then the rest in LPT order.
    kPinnedFirst,
    // Packing first, for steps whose documents LPT cannot fit: LPT order,
    // each doc to the sequence (of any rank) with the least room that fits
    // it (best-fit decreasing); balance is left to the local search.
    kPackFirst,
  };

  // Places every doc. Returns false when some doc fits no sequence at all;
  // *within is false when some rank ends above the bound.
  bool Greedy(Order order_kind, bool use_affinity, double bound, bool* within,
              uint32_t* unplaceable);

  void Load(const LlmAssignment& a) {
    trees_live_ = false;
    for (size_t d = 0; d < a.rank.size(); ++d) Place(d, a.rank[d], a.seq[d]);
  }
  LlmAssignment Result() const { return LlmAssignment{rank_, seq_}; }
  double Peak() const { return *std::max_element(state_.costs().begin(), state_.costs().end()); }

  // Records Place/Unplace from now on so that Rollback() can undo them.
  void Checkpoint() {
    undo_.clear();
    logging_ = true;
  }
  void Commit() { logging_ = false; }
  void Rollback() {
    logging_ = false;
    for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) {
      if (it->rank == kUnplaced) {
        Unplace(it->doc);  // undo a Place
      } else {
        Place(it->doc, it->rank, it->seq);  // undo an Unplace
      }
    }
    undo_.clear();
  }

  // Brings every rank within `bound` by moves and same-modality swaps that
  // never add bytes, looking at most at *budget candidates. True on success.
  bool RepairBound(double bound, uint64_t* budget);

  // What balance moves may do to the inter-node bytes.
  enum class ByteRule {
    kIgnore,  // node-oblivious
    kNone,    // never add bytes
    kFewest,  // a change that adds none first, else the fewest per unit of peak taken off
  };
  // Moves and swaps off the most loaded rank. Stops when the peak rank
  // cannot be lowered or is at most stop_at.
  void ImproveBalance(ByteRule bytes, uint32_t rounds, double stop_at);
  void ImproveBalance(bool node_aware, uint32_t rounds, double stop_at) {
    ImproveBalance(node_aware ? ByteRule::kNone : ByteRule::kIgnore, rounds, stop_at);
  }
  // Moves or swaps docs onto cheaper nodes while every rank stays within bound.
  void ImproveLocality(double bound);

 private:
  void Touch(uint32_t r) {
    if (trees_live_) {
      for (int m = 0; m < 2; ++m) {
        if (!dirty_[m][r]) dirty_[m][r] = 1, dirty_list_[m].push_back(r);
      }
    }
    if (ordered_active_) {
      ordered_.erase({ordered_cost_[r], r});
      ordered_cost_[r] = cost(r);
      ordered_.insert({cost(r), r});
    }
  }
  bool TryEject(uint32_t d, uint32_t e, double bound, uint64_t e_max_bytes);
  struct Undo {
    uint32_t doc, rank, seq;  // rank kUnplaced: the doc was placed
  };
  std::vector<Undo> undo_;
  bool logging_ = false;

  const LlmProblem& p_;
  CostModel model_;
  SequenceState state_;
  std::vector<std::vector<uint32_t>> members_;
  std::vector<uint32_t> rank_, seq_, pos_;
  std::vector<double> cost_;
  MinTree trees_[2];        // ranks by cost, per modality (text, VL) while they have room
  bool trees_live_ = true;  // kept up to date until the greedy is done
  // Ranks whose cost changed since a tree last read it (trees are brought up
  // to date when asked, so a modality asked rarely costs little).
  std::vector<uint8_t> dirty_[2];
  std::vector<uint32_t> dirty_list_[2];
  uint32_t smallest_[2] = {~0u, ~0u};  // smallest doc tokens per modality
  double lower_bound_;
  std::vector<std::pair<uint64_t, uint32_t>> cheaper_;
  // Ranks out of a modality's tree for lack of room, by room (max first).
  std::priority_queue<std::pair<uint32_t, uint32_t>> parked_[2];
  // ImproveBalance's swap partners of one rank by (modality, cost).
  struct SortedDoc {
    bool vl;
    double cost;
    uint32_t doc;
    bool operator<(const SortedDoc& o) const {
      return vl != o.vl ? vl < o.vl : cost != o.cost ? cost < o.cost : doc < o.doc;
    }
  };
  std::vector<SortedDoc> by_cost_;
  // Ranks by cost, kept only while ImproveBalance runs.
  std::set<std::pair<double, uint32_t>> ordered_;
  std::vector<double> ordered_cost_;
  bool ordered_active_ = false;
};

}  // namespace tutti::dispatch::internal

#endif  // TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_LLM_PLACER_H_
