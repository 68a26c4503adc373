#include "services/packer/dispatch/llm_phase.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <queue>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "services/packer/dispatch/min_tree.h"

namespace tutti::dispatch {
namespace {

constexpr uint32_t kUnplaced = ~0u;
constexpr double kRelSlack = 1e-9;
// Steps with at most this many documents also try the pinned-first greedy.
constexpr size_t kPortfolioDocs = 20000;

bool Within(double cost, double bound) { return cost <= bound + kRelSlack * std::abs(bound); }

// Docs by decreasing tokens (hence decreasing cost), ties by index: a
// counting sort when lengths are bounded (they are at most seq_len).
std::vector<uint32_t> LptOrder(const std::vector<LlmDoc>& docs) {
  std::vector<uint32_t> order(docs.size());
  uint32_t longest = 0;
  for (const LlmDoc& d : docs) longest = std::max(longest, d.tokens);
  if (longest > (1u << 22)) {
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return docs[a].tokens > docs[b].tokens; });
    return order;
  }
  std::vector<uint32_t> start(longest + 2, 0);  // by (longest - tokens)
  for (const LlmDoc& d : docs) ++start[longest - d.tokens + 1];
  for (uint32_t k = 1; k < start.size(); ++k) start[k] += start[k - 1];
  for (uint32_t i = 0; i < docs.size(); ++i) order[start[longest - docs[i].tokens]++] = i;
  return order;
}

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
    for (size_t d = 0; d < p.docs.size(); ++d) {
      cost_[d] = model_.Llm(p.docs[d].tokens);
      smallest_[p.docs[d].vl] = std::min(smallest_[p.docs[d].vl], p.docs[d].tokens);
    }
  }

  void Place(uint32_t d, uint32_t r, uint32_t q) {
    if (logging_) undo_.push_back({d, kUnplaced, 0});
    state_.Add(r, q, p_.docs[d].tokens, cost_[d]);
    rank_[d] = r, seq_[d] = q, pos_[d] = static_cast<uint32_t>(members_[r].size());
    members_[r].push_back(d);
    Touch(r);
  }
  void Unplace(uint32_t d) {
    const uint32_t r = rank_[d];
    if (logging_) undo_.push_back({d, r, seq_[d]});
    state_.Remove(r, seq_[d], p_.docs[d].tokens, cost_[d]);
    auto& m = members_[r];
    const uint32_t last = m.back();
    m[pos_[d]] = last;
    pos_[last] = pos_[d];
    m.pop_back();
    rank_[d] = kUnplaced;
    Touch(r);
  }
  bool Best(uint32_t r, uint32_t d, uint32_t* q, double* delta) const {
    return state_.BestSequence(r, p_.docs[d].tokens, p_.docs[d].vl, q, delta);
  }
  uint64_t Bytes(uint32_t d, uint32_t node) const {
    return p_.affinity.empty() ? 0 : p_.affinity.Bytes(d, node);
  }
  uint32_t node(uint32_t r) const { return p_.cluster.node_of(r); }
  double cost(uint32_t r) const { return state_.cost(r); }
  double doc_cost(uint32_t d) const { return cost_[d]; }

  // Lowest-cost rank with room for d (ignoring the bound); kUnplaced if none.
  // For the greedy, which asks in decreasing doc length: a rank found
  // without room for the current length leaves its modality's tree and
  // returns once the length drops to its room (a rank without room even for
  // the modality's smallest doc stays out).
  uint32_t LeastLoadedWithRoom(uint32_t d, uint32_t* q, double* delta) {
    const bool vl = p_.docs[d].vl;
    const uint32_t t = p_.docs[d].tokens;
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
      if (Best(r, d, q, delta)) return r;
      tree.Mask(r, true);
      const uint32_t room = state_.room(r, vl);
      if (room >= smallest_[vl]) parked.push({room, r});
    }
    return kUnplaced;
  }

  // Least loaded rank of `node` that takes d within `bound`.
  uint32_t BestInNode(uint32_t n, uint32_t d, double bound, uint32_t* q, double* delta) const {
    uint32_t best = kUnplaced;
    double best_cost = 0;
    const uint32_t first = n * p_.cluster.ranks_per_node;
    for (uint32_t r = first; r < first + p_.cluster.ranks_per_node; ++r) {
      uint32_t rq;
      double rd;
      if (!Best(r, d, &rq, &rd) || !Within(cost(r) + rd, bound)) continue;
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
    std::sort(nodes.begin(), nodes.end());
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
  };

  // Places every doc. Returns false when some doc fits no sequence at all;
  // *within is false when some rank ends above the bound.
  bool Greedy(Order order_kind, bool use_affinity, double bound, bool* within,
              uint32_t* unplaceable) {
    const bool aff = use_affinity && !p_.affinity.empty();
    const double headroom = std::isfinite(bound) ? 0.5 * std::max(0.0, bound - lower_bound_) : 0.0;
    // Cost still to place per rank: what later docs can even out.
    double remaining = 0;
    for (double c : cost_) remaining += c;
    const double W = p_.cluster.world_size;
    std::vector<uint32_t> order = LptOrder(p_.docs);
    std::vector<uint8_t> pinned(p_.docs.size(), 0);
    if (aff && order_kind == Order::kPinnedFirst) {
      std::vector<uint32_t> big, pin, rest;
      std::vector<uint64_t> regret(p_.docs.size(), 0);
      for (uint32_t d : order) {
        if (std::isfinite(bound) && cost_[d] > 0.5 * bound) {
          big.push_back(d);
        } else if (p_.affinity.base(d) > 0) {
          // Bytes at the second cheapest node minus at the cheapest.
          uint64_t best = p_.affinity.base(d), second = p_.affinity.base(d);
          for (const auto* x = p_.affinity.begin(d); x != p_.affinity.end(d); ++x) {
            const uint64_t b = p_.affinity.base(d) - x->saved;
            if (b < best) {
              second = best, best = b;
            } else if (b < second) {
              second = b;
            }
          }
          if (p_.affinity.end(d) - p_.affinity.begin(d) >= int(p_.cluster.nodes())) {
            regret[d] = second - best;
          } else {
            regret[d] = p_.affinity.base(d) - best;
          }
          pin.push_back(d);
          pinned[d] = 1;
        } else {
          rest.push_back(d);
        }
      }
      std::stable_sort(pin.begin(), pin.end(),
                       [&](uint32_t a, uint32_t b) { return regret[a] > regret[b]; });
      order = big;
      order.insert(order.end(), pin.begin(), pin.end());
      order.insert(order.end(), rest.begin(), rest.end());
    }
    for (uint32_t d : order) {
      remaining -= cost_[d];
      uint32_t q = 0;
      double delta = 0;
      uint32_t r = kUnplaced;
      if (pinned[d]) {
        for (const auto& [bytes, n] : CheaperNodes(d, p_.affinity.base(d))) {
          r = BestInNode(n, d, bound, &q, &delta);
          if (r != kUnplaced) break;
        }
      }
      if (r == kUnplaced) r = LeastLoadedWithRoom(d, &q, &delta);
      if (r == kUnplaced) {
        *unplaceable = d;
        return false;
      }
      if (aff && !pinned[d] && p_.affinity.base(d) > 0 && p_.affinity.Bytes(d, node(r)) > 0) {
        const double slack = std::max(headroom, remaining / W);
        const double limit = std::min(cost(r) + delta + slack, bound);
        for (const auto& [bytes, n] : CheaperNodes(d, p_.affinity.Bytes(d, node(r)))) {
          uint32_t nq;
          double nd;
          const uint32_t nr = BestInNode(n, d, limit, &nq, &nd);
          if (nr != kUnplaced) {
            r = nr, q = nq, delta = nd;
            break;
          }
        }
      }
      Place(d, r, q);
    }
    trees_live_ = false;
    *within = Within(Peak(), bound);
    return true;
  }

  void Load(const LlmAssignment& a) {
    trees_live_ = false;
    for (size_t d = 0; d < a.rank.size(); ++d) Place(d, a.rank[d], a.seq[d]);
  }
  LlmAssignment Result() const { return LlmAssignment{rank_, seq_}; }
  double Peak() const {
    return *std::max_element(state_.costs().begin(), state_.costs().end());
  }

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

  // Moves and swaps off the most loaded rank; with node_aware, never adds
  // bytes. Stops when the peak rank cannot be lowered or is at most stop_at.
  void ImproveBalance(bool node_aware, uint32_t rounds, double stop_at);
  // Moves or swaps docs onto cheaper nodes while every rank stays within bound.
  void ImproveLocality(double bound);

 private:
  void Touch(uint32_t r) {
    if (trees_live_) {
      trees_[0].Update(r);
      trees_[1].Update(r);
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
  MinTree trees_[2];  // ranks by cost, per modality (text, VL) while they have room
  bool trees_live_ = true;  // kept up to date until the greedy is done
  uint32_t smallest_[2] = {~0u, ~0u};  // smallest doc tokens per modality
  double lower_bound_;
  std::vector<std::pair<uint64_t, uint32_t>> cheaper_;
  // Ranks out of a modality's tree for lack of room, by room (max first).
  std::priority_queue<std::pair<uint32_t, uint32_t>> parked_[2];
  // Ranks by cost, kept only while ImproveBalance runs.
  std::set<std::pair<double, uint32_t>> ordered_;
  std::vector<double> ordered_cost_;
  bool ordered_active_ = false;
};

void Placer::ImproveBalance(bool node_aware, uint32_t rounds, double stop_at) {
  const uint32_t W = p_.cluster.world_size;
  if (W <= 1) return;
  constexpr uint32_t kTargets = 6;
  constexpr uint32_t kSwapChecks = 1u << 12;
  constexpr uint32_t kScan = 256;
  ordered_.clear();
  ordered_cost_.assign(W, 0.0);
  for (uint32_t r = 0; r < W; ++r) {
    ordered_cost_[r] = cost(r);
    ordered_.insert({cost(r), r});
  }
  ordered_active_ = true;
  std::vector<uint32_t> targets;
  const uint64_t max_steps = uint64_t{rounds} * W;
  for (uint64_t step = 0; step < max_steps; ++step) {
    const uint32_t top = ordered_.rbegin()->second;
    const double peak = cost(top);
    if (peak <= stop_at) break;
    // The least loaded ranks that have room for one of top's documents.
    uint32_t smallest[2] = {~0u, ~0u};
    for (uint32_t d : members_[top]) {
      smallest[p_.docs[d].vl] = std::min(smallest[p_.docs[d].vl], p_.docs[d].tokens);
    }
    targets.clear();
    uint32_t scanned = 0;
    for (auto it = ordered_.begin(); it != ordered_.end() && targets.size() < kTargets &&
                                     scanned < kScan && it->first < peak;
         ++it, ++scanned) {
      const uint32_t r = it->second;
      if (state_.room(r, false) >= smallest[0] || state_.room(r, true) >= smallest[1]) {
        targets.push_back(r);
      }
    }
    // Swaps need room only for the difference: add the least loaded others.
    for (auto it = ordered_.begin(); it != ordered_.end() && targets.size() < 2 * kTargets; ++it) {
      if (it->second != top && std::find(targets.begin(), targets.end(), it->second) == targets.end()) {
        targets.push_back(it->second);
      }
    }
    if (node_aware && p_.cluster.ranks_per_node > 1) {
      const uint32_t first = node(top) * p_.cluster.ranks_per_node;
      uint32_t local = kUnplaced;
      for (uint32_t r = first; r < first + p_.cluster.ranks_per_node; ++r) {
        if (r != top && (local == kUnplaced || cost(r) < cost(local))) local = r;
      }
      if (std::find(targets.begin(), targets.end(), local) == targets.end()) {
        targets.push_back(local);
      }
    }
    double best = peak * (1 - 1e-12);
    uint32_t best_d = kUnplaced, best_e = kUnplaced, best_t = 0, best_q = 0;
    for (uint32_t t : targets) {
      for (uint32_t d : members_[top]) {
        if (node_aware && Bytes(d, node(t)) > Bytes(d, node(top))) continue;
        uint32_t q;
        double add;
        if (!Best(t, d, &q, &add)) continue;
        const double rm = state_.RemoveDelta(top, seq_[d], p_.docs[d].tokens, cost_[d]);
        const double v = std::max(peak - rm, cost(t) + add);
        if (v < best) best = v, best_d = d, best_e = kUnplaced, best_t = t, best_q = q;
      }
    }
    uint32_t checks = 0;
    for (uint32_t t : targets) {
      if (best_d != kUnplaced || checks > kSwapChecks) break;
      for (uint32_t d : members_[top]) {
        if (checks > kSwapChecks) break;
        for (uint32_t e : members_[t]) {
          if (++checks > kSwapChecks) break;
          if (p_.docs[e].vl != p_.docs[d].vl || p_.docs[e].tokens >= p_.docs[d].tokens) continue;
          if (node_aware && Bytes(d, node(t)) + Bytes(e, node(top)) >
                                Bytes(d, node(top)) + Bytes(e, node(t))) {
            continue;
          }
          double dt, dtop;
          if (!state_.ReplaceDelta(t, seq_[e], p_.docs[e].tokens, cost_[e], p_.docs[d].tokens,
                                   cost_[d], &dt) ||
              !state_.ReplaceDelta(top, seq_[d], p_.docs[d].tokens, cost_[d], p_.docs[e].tokens,
                                   cost_[e], &dtop)) {
            continue;
          }
          const double v = std::max(peak + dtop, cost(t) + dt);
          if (v < best) best = v, best_d = d, best_e = e, best_t = t;
        }
      }
    }
    if (best_d == kUnplaced) break;
    if (best_e == kUnplaced) {
      Unplace(best_d);
      Place(best_d, best_t, best_q);
    } else {
      const uint32_t qd = seq_[best_d], qe = seq_[best_e];
      Unplace(best_d);
      Unplace(best_e);
      Place(best_d, best_t, qe);
      Place(best_e, top, qd);
    }
  }
  ordered_active_ = false;
}

// Moves d into e's rank and e out of it, to the first rank that takes it
// within the bound among: d's old rank, the other ranks of d's old node, the
// other ranks of e's node; `e_nodes_ok` limits e to nodes where its bytes do
// not exceed `e_max_bytes`. Keeps the change only if every touched rank stays
// within the bound; otherwise restores everything.
bool Placer::TryEject(uint32_t d, uint32_t e, double bound, uint64_t e_max_bytes) {
  const uint32_t rd = rank_[d], qd = seq_[d], re = rank_[e], qe = seq_[e];
  Unplace(d);
  Unplace(e);
  uint32_t q;
  double a;
  if (Best(re, d, &q, &a) && Within(cost(re) + a, bound)) {
    Place(d, re, q);
    const uint32_t rpn = p_.cluster.ranks_per_node;
    const uint32_t firsts[3] = {rd, node(rd) * rpn, node(re) * rpn};
    const uint32_t counts[3] = {1, rpn, rpn};
    for (int k = 0; k < 3; ++k) {
      for (uint32_t r = firsts[k]; r < firsts[k] + counts[k]; ++r) {
        if ((k > 0 && r == rd) || r == re || Bytes(e, node(r)) > e_max_bytes) continue;
        uint32_t q2;
        double a2;
        if (Best(r, e, &q2, &a2) && Within(cost(r) + a2, bound)) {
          Place(e, r, q2);
          return true;
        }
      }
    }
    Unplace(d);
  }
  Place(d, rd, qd);
  Place(e, re, qe);
  return false;
}

bool Placer::RepairBound(double bound, uint64_t* budget) {
  const uint32_t W = p_.cluster.world_size;
  while (true) {
    uint32_t top = 0;
    for (uint32_t r = 1; r < W; ++r) {
      if (cost(r) > cost(top)) top = r;
    }
    const double peak = cost(top);
    if (Within(peak, bound)) return true;
    double best = peak;
    uint32_t best_d = kUnplaced, best_e = kUnplaced, best_t = 0, best_q = 0;
    for (uint32_t t = 0; t < W; ++t) {
      if (t == top) continue;
      for (uint32_t d : members_[top]) {
        if (*budget == 0) return false;
        --*budget;
        const uint64_t d_here = Bytes(d, node(top)), d_there = Bytes(d, node(t));
        uint32_t q;
        double add;
        if (d_there <= d_here && Best(t, d, &q, &add) && Within(cost(t) + add, bound)) {
          const double v = peak - state_.RemoveDelta(top, seq_[d], p_.docs[d].tokens, cost_[d]);
          if (v < best) best = v, best_d = d, best_e = kUnplaced, best_t = t, best_q = q;
        }
        for (uint32_t e : members_[t]) {
          if (p_.docs[e].vl != p_.docs[d].vl || p_.docs[e].tokens >= p_.docs[d].tokens) continue;
          if (d_there + Bytes(e, node(top)) > d_here + Bytes(e, node(t))) continue;
          double dt, dtop;
          if (!state_.ReplaceDelta(t, seq_[e], p_.docs[e].tokens, cost_[e], p_.docs[d].tokens,
                                   cost_[d], &dt) ||
              !state_.ReplaceDelta(top, seq_[d], p_.docs[d].tokens, cost_[d], p_.docs[e].tokens,
                                   cost_[e], &dtop) ||
              !Within(cost(t) + dt, bound)) {
            continue;
          }
          if (peak + dtop < best) best = peak + dtop, best_d = d, best_e = e, best_t = t;
        }
      }
    }
    if (best_d == kUnplaced) return false;
    if (best_e == kUnplaced) {
      Unplace(best_d);
      Place(best_d, best_t, best_q);
    } else {
      const uint32_t qd = seq_[best_d], qe = seq_[best_e];
      Unplace(best_d);
      Unplace(best_e);
      Place(best_d, best_t, qe);
      Place(best_e, top, qd);
    }
  }
}

void Placer::ImproveLocality(double bound) {
  if (p_.affinity.empty()) return;
  // Work budget in candidate partners looked at, proportional to the docs.
  uint64_t budget = 64 * uint64_t{static_cast<uint32_t>(p_.docs.size())} + 4096;
  constexpr int kPasses = 8;
  std::vector<std::pair<uint64_t, uint32_t>> cands;
  std::vector<uint32_t> others;
  for (int pass = 0; pass < kPasses && budget > 0; ++pass) {
    // Docs whose node is not their cheapest, most excess bytes first.
    cands.clear();
    for (uint32_t d = 0; d < p_.docs.size(); ++d) {
      const uint64_t cur = Bytes(d, node(rank_[d]));
      if (cur == 0) continue;
      uint64_t best = cur;
      for (const auto* x = p_.affinity.begin(d); x != p_.affinity.end(d); ++x) {
        best = std::min(best, p_.affinity.base(d) - x->saved);
      }
      if (best < cur) cands.push_back({cur - best, d});
    }
    std::stable_sort(cands.begin(), cands.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    bool improved = false;
    for (const auto& [excess, d] : cands) {
      if (budget == 0) break;
      const uint32_t from = node(rank_[d]);
      const uint64_t cur = Bytes(d, from);
      bool done = false;
      // Copy: TryEject calls nothing that reuses cheaper_, but moves edit it.
      const std::vector<std::pair<uint64_t, uint32_t>> targets = CheaperNodes(d, cur);
      for (const auto& [bytes, n] : targets) {
        uint32_t q;
        double delta;
        const uint32_t r = BestInNode(n, d, bound, &q, &delta);
        if (r != kUnplaced) {
          Unplace(d);
          Place(d, r, q);
          done = true;
          break;
        }
        // Eject a doc e of node n whose own bytes grow less than d's shrink.
        const uint64_t gain = cur - bytes;
        const uint32_t first = n * p_.cluster.ranks_per_node;
        for (uint32_t r2 = first; r2 < first + p_.cluster.ranks_per_node && !done; ++r2) {
          others = members_[r2];
          for (uint32_t e : others) {
            if (budget == 0) break;
            --budget;
            const uint64_t e_now = Bytes(e, n);
            // e may go where its bytes rise by less than `gain`.
            if (TryEject(d, e, bound, e_now + gain - 1)) {
              done = true;
              break;
            }
          }
        }
        if (done) break;
        // Small steps: move d anyway (least loaded rank of n with room) and
        // win the bound back with moves that add no bytes; undo if that fails.
        if (p_.docs.size() <= kPortfolioDocs) {
          uint32_t rq = 0, best_r = kUnplaced;
          for (uint32_t r2 = first; r2 < first + p_.cluster.ranks_per_node; ++r2) {
            uint32_t q2;
            double a2;
            if (Best(r2, d, &q2, &a2) && (best_r == kUnplaced || cost(r2) < cost(best_r))) {
              best_r = r2, rq = q2;
            }
          }
          if (best_r != kUnplaced) {
            Checkpoint();
            Unplace(d);
            Place(d, best_r, rq);
            if (RepairBound(bound, &budget)) {
              Commit();
              done = true;
              break;
            }
            Rollback();
          }
        }
      }
      improved |= done;
    }
    if (!improved) break;
  }
}

}  // namespace

void NodeAffinity::AddDoc(uint64_t base, std::vector<Entry>* entries) {
  // Insertion sort by node: a doc lists a handful of nodes.
  std::vector<Entry>& e = *entries;
  for (size_t i = 1; i < e.size(); ++i) {
    for (size_t k = i; k > 0 && e[k].node < e[k - 1].node; --k) std::swap(e[k], e[k - 1]);
  }
  const size_t first = entries_.size();
  for (const Entry& x : e) {
    if (entries_.size() > first && entries_.back().node == x.node) {
      entries_.back().saved += x.saved;
    } else if (x.saved > 0) {
      entries_.push_back(x);
    }
  }
  base_.push_back(base);
  offset_.push_back(static_cast<uint32_t>(entries_.size()));
}

uint64_t NodeAffinity::Bytes(uint32_t d, uint32_t node) const {
  for (const Entry* e = begin(d); e != end(d); ++e) {
    if (e->node == node) return base_[d] - e->saved;
  }
  return base_[d];
}

double LlmLowerBound(const LlmProblem& p) {
  const CostModel model(p.cost);
  const uint32_t W = p.cluster.world_size;
  if (W == 0) return 0;
  double largest = 0, total = 0;
  uint64_t tokens[2] = {0, 0};
  for (const LlmDoc& d : p.docs) {
    const double c = model.Llm(d.tokens);
    if (p.padded) {
      const uint32_t mb_size = d.vl ? p.slots.vl_micro_batch : p.slots.text_micro_batch;
      largest = std::max(largest, mb_size * c);
      tokens[d.vl] += d.tokens;
    } else {
      largest = std::max(largest, c);
      total += c;
    }
  }
  if (p.padded) {
    const double k[2] = {double(W) * p.slots.text_sequences(), double(W) * p.slots.vl_sequences()};
    for (int m = 0; m < 2; ++m) {
      if (k[m] > 0) total += k[m] * model.Llm(tokens[m] / k[m]);
    }
  }
  return std::max(total / W, largest);
}

absl::StatusOr<LlmAssignment> BalanceLlm(const LlmProblem& problem, uint32_t rounds) {
  Placer placer(problem);
  bool within;
  uint32_t bad = 0;
  if (!placer.Greedy(Placer::Order::kLpt, false, std::numeric_limits<double>::infinity(), &within,
                     &bad)) {
    const LlmDoc& d = problem.docs[bad];
    return absl::ResourceExhaustedError(absl::StrCat(
        "the step's documents do not fit its sequences: a ", d.vl ? "VL" : "text-only",
        " document of ", d.tokens, " tokens found no ", d.vl ? "VL" : "text",
        " sequence with room (", problem.cluster.world_size, " ranks x ",
        d.vl ? problem.slots.vl_sequences() : problem.slots.text_sequences(),
        " sequences of ", problem.slots.seq_len,
        " tokens); draw fewer samples per step or add sequences"));
  }
  placer.ImproveBalance(false, rounds, LlmLowerBound(problem) * (1 + 1e-6));
  return placer.Result();
}

absl::StatusOr<RearrangeResult> RearrangeLlm(const LlmProblem& problem, uint32_t rounds,
                                             double tolerance, const LlmAssignment* balanced) {
  const double stop_at = LlmLowerBound(problem) * (1 + 1e-6);
  // The greedy (both orders on small steps, where it is cheap, keeping the
  // one with fewer bytes) and its local searches within `bound`; false if
  // no order meets the bound.
  const bool small = problem.docs.size() <= kPortfolioDocs;
  auto attempt = [&](double bound, RearrangeResult* out) {
    bool found = false;
    uint64_t found_bytes = 0;
    for (Placer::Order order : {Placer::Order::kLpt, Placer::Order::kPinnedFirst}) {
      if (order == Placer::Order::kPinnedFirst && !small) break;
      Placer placer(problem);
      bool within = false;
      uint32_t bad = 0;
      if (!placer.Greedy(order, true, bound, &within, &bad)) continue;
      if (!within) placer.ImproveBalance(true, rounds, stop_at);
      if (!Within(placer.Peak(), bound)) continue;
      placer.ImproveLocality(bound);
      placer.ImproveBalance(true, rounds, stop_at);
      LlmAssignment a = placer.Result();
      const uint64_t bytes = LlmInterNodeBytes(problem, a);
      if (!found || bytes < found_bytes) {
        found = true, found_bytes = bytes;
        out->assignment = std::move(a);
        out->bound = bound;
      }
    }
    return found;
  };
  RearrangeResult out;
  if (attempt(problem.bound, &out)) return out;
  // The bound is out of the greedy's reach: measure what balancing alone
  // reaches and allow the tolerance on top of that.
  LlmAssignment own;
  if (balanced == nullptr) {
    ASSIGN_OR_RETURN(own, BalanceLlm(problem, rounds));
    balanced = &own;
  }
  const auto cost = LlmRankCosts(problem, *balanced);
  const double raised = std::max(problem.bound, (1 + tolerance) * *std::max_element(cost.begin(), cost.end()));
  out.fell_back = true;
  if (attempt(raised, &out)) return out;
  Placer placer(problem);
  placer.Load(*balanced);
  placer.ImproveLocality(raised);
  placer.ImproveBalance(true, rounds, stop_at);
  out.assignment = placer.Result();
  out.bound = raised;
  return out;
}

std::vector<double> LlmRankCosts(const LlmProblem& problem, const LlmAssignment& a) {
  const CostModel model(problem.cost);
  const SlotLayout& s = problem.slots;
  const uint32_t W = problem.cluster.world_size;
  std::vector<double> cost(W, 0.0);
  if (!problem.padded) {
    for (size_t d = 0; d < a.rank.size(); ++d) cost[a.rank[d]] += model.Llm(problem.docs[d].tokens);
    return cost;
  }
  std::vector<uint32_t> fill(size_t{W} * s.sequences(), 0);
  for (size_t d = 0; d < a.rank.size(); ++d) {
    fill[size_t{a.rank[d]} * s.sequences() + a.seq[d]] += problem.docs[d].tokens;
  }
  for (uint32_t r = 0; r < W; ++r) {
    for (uint32_t mb = 0; mb < s.micro_batches(); ++mb) {
      uint32_t longest = 0;
      for (uint32_t q = s.first_sequence(mb); q < s.first_sequence(mb) + s.micro_batch_size(mb);
           ++q) {
        longest = std::max(longest, fill[size_t{r} * s.sequences() + q]);
      }
      cost[r] += s.micro_batch_size(mb) * model.Llm(longest);
    }
  }
  return cost;
}

uint64_t LlmInterNodeBytes(const LlmProblem& problem, const LlmAssignment& a) {
  if (problem.affinity.empty()) return 0;
  uint64_t total = 0;
  for (size_t d = 0; d < a.rank.size(); ++d) {
    total += problem.affinity.Bytes(d, problem.cluster.node_of(a.rank[d]));
  }
  return total;
}

absl::Status CheckLlmAssignment(const LlmProblem& problem, const LlmAssignment& a,
                                bool check_bound) {
  const SlotLayout& s = problem.slots;
  const uint32_t W = problem.cluster.world_size;
  if (a.rank.size() != problem.docs.size() || a.seq.size() != problem.docs.size()) {
    return absl::InternalError(absl::StrCat("assignment covers ", a.rank.size(), " docs, not ",
                                            problem.docs.size()));
  }
  std::vector<uint32_t> fill(size_t{W} * s.sequences(), 0);
  for (size_t d = 0; d < a.rank.size(); ++d) {
    if (a.rank[d] >= W || a.seq[d] >= s.sequences()) {
      return absl::InternalError(absl::StrCat("doc ", d, " placed on rank ", a.rank[d],
                                              " sequence ", a.seq[d], ": out of range"));
    }
    if (s.is_vl_sequence(a.seq[d]) != problem.docs[d].vl) {
      return absl::InternalError(absl::StrCat("doc ", d, " is in a sequence of the other modality"));
    }
    fill[size_t{a.rank[d]} * s.sequences() + a.seq[d]] += problem.docs[d].tokens;
  }
  for (size_t i = 0; i < fill.size(); ++i) {
    if (fill[i] > s.seq_len) {
      return absl::InternalError(absl::StrCat("rank ", i / s.sequences(), " sequence ",
                                              i % s.sequences(), " holds ", fill[i],
                                              " tokens, above seq_len ", s.seq_len));
    }
  }
  if (check_bound) {
    const auto cost = LlmRankCosts(problem, a);
    for (uint32_t r = 0; r < W; ++r) {
      if (!Within(cost[r], problem.bound)) {
        return absl::InternalError(
            absl::StrCat("rank ", r, " LLM cost ", cost[r], " exceeds the bound ", problem.bound));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tutti::dispatch
