#include "services/packer/core/post_balancing/llm_placer.h"

#include <numeric>

namespace tutti::dispatch::internal {

// A counting sort when lengths are bounded (they are at most seq_len).
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

bool Placer::Greedy(Order order_kind, bool use_affinity, double bound, bool* within,
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
  // The docs' fields in placement order, gathered once (the loads are
  // independent, so they overlap), so that the loop reads them in sequence:
  // docs come in length order, scattered in memory.
  struct Pending {
    uint32_t d;
    LlmDoc doc;
    double cost;
    uint64_t base;
    bool pinned;
  };
  std::vector<Pending> todo(order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    const uint32_t d = order[k];
    todo[k] = Pending{d, p_.docs[d], cost_[d], p_.affinity.base(d), pinned[d] != 0};
  }
  for (const Pending& x : todo) {
    const uint32_t d = x.d;
    remaining -= x.cost;
    uint32_t q = 0;
    double delta = 0;
    uint32_t r = kUnplaced;
    if (x.pinned) {
      for (const auto& [bytes, n] : CheaperNodes(d, x.base)) {
        r = BestInNode(n, x.doc, bound, &q, &delta);
        if (r != kUnplaced) break;
      }
    }
    if (r == kUnplaced && aff && !x.pinned && x.base > 0) {
      // The least loaded rank of a cheaper node, if no more than `slack`
      // above the least loaded rank anywhere.
      const uint32_t least = LeastLoaded();
      const double slack = std::max(headroom, remaining / W);
      const double limit =
          std::min((least == MinTree::kNone ? 0.0 : cost(least)) + x.cost + slack, bound);
      for (const auto& [bytes, n] : CheaperNodes(d, x.base)) {
        r = BestInNode(n, x.doc, limit, &q, &delta);
        if (r != kUnplaced) break;
      }
    }
    if (r == kUnplaced && order_kind == Order::kPackFirst) {
      // Best fit over every rank: the fullest sequence that still fits d.
      uint32_t best_fill = 0;
      for (uint32_t rr = 0; rr < p_.cluster.world_size; ++rr) {
        uint32_t rq;
        double rd;
        if (!Best(rr, d, &rq, &rd)) continue;
        const uint32_t fill = state_.tokens(rr, rq);
        if (r == kUnplaced || fill > best_fill) r = rr, q = rq, delta = rd, best_fill = fill;
      }
    }
    if (r == kUnplaced) r = LeastLoadedWithRoom(x.doc, &q, &delta);
    if (r == kUnplaced) {
      *unplaceable = d;
      return false;
    }
    Place(d, r, q, x.doc, x.cost);
  }
  trees_live_ = false;
  *within = Within(Peak(), bound);
  return true;
}

void Placer::ImproveBalance(Placer::ByteRule mode, uint32_t rounds, double stop_at) {
  const bool node_aware = mode != ByteRule::kIgnore;
  const bool fewest = mode == ByteRule::kFewest;
  const uint32_t W = p_.cluster.world_size;
  if (W <= 1) return;
  constexpr uint32_t kTargets = 6;
  // Swap pairs looked at per step: many on small steps, where each step
  // matters, few on large ones, where many ranks share the work.
  const uint32_t kSwapChecks = W <= 256 ? 1u << 12 : 1u << 9;
  constexpr uint32_t kScan = 256;
  ordered_.clear();
  ordered_cost_.assign(W, 0.0);
  for (uint32_t r = 0; r < W; ++r) {
    ordered_cost_[r] = cost(r);
    ordered_.insert({cost(r), r});
  }
  ordered_active_ = true;
  std::vector<uint32_t> targets, swap_targets;
  std::vector<double> here;
  constexpr size_t kSortedSwaps = 3;
  // Unpadded, a doc adds its own cost to a rank; padded, possibly nothing.
  const double min_add = p_.padded ? 0.0 : 1.0;
  // Buying balance with bytes takes at most rounds x min(W, 128) steps: at
  // W = 2560, rounds x W steps would cost more than the rest of the plan.
  const uint64_t max_steps =
      uint64_t{rounds} * (fewest ? std::min<uint32_t>(W, kFewestBytesRanks) : W);
  // Stop once the peak is within 0.01% of the mean (checked every 16 steps;
  // padded costs change the mean as documents move), or when W steps lowered
  // it by less than 0.01%.
  double last_peak = ordered_.rbegin()->first;
  for (uint64_t step = 0; step < max_steps; ++step) {
    const uint32_t top = ordered_.rbegin()->second;
    const double peak = cost(top);
    if (peak <= stop_at) break;
    if (step % 16 == 0) {
      double total = 0;
      for (uint32_t r = 0; r < W; ++r) total += cost(r);
      if (peak <= (1 + 1e-4) * total / W) break;
    }
    if (step > 0 && step % W == 0) {
      if (peak > (1 - 1e-4) * last_peak) break;
      last_peak = peak;
    }
    // The least loaded ranks that have room for one of top's documents.
    uint32_t smallest[2] = {~0u, ~0u};
    for (uint32_t d : members_[top]) {
      smallest[p_.docs[d].vl] = std::min(smallest[p_.docs[d].vl], p_.docs[d].tokens);
    }
    targets.clear();
    uint32_t scanned = 0;
    for (auto it = ordered_.begin();
         it != ordered_.end() && targets.size() < kTargets && scanned < kScan && it->first < peak;
         ++it, ++scanned) {
      const uint32_t r = it->second;
      if (state_.room(r, false) >= smallest[0] || state_.room(r, true) >= smallest[1]) {
        targets.push_back(r);
      }
    }
    // Swaps need room only for the difference: add the least loaded others
    // (not for unpadded kFewest, whose swaps look at the least loaded ranks
    // by cost below).
    const size_t with_others = fewest && !p_.padded ? 0 : 2 * kTargets;
    for (auto it = ordered_.begin(); it != ordered_.end() && targets.size() < with_others; ++it) {
      if (it->second != top &&
          std::find(targets.begin(), targets.end(), it->second) == targets.end()) {
        targets.push_back(it->second);
      }
    }
    // Top's least loaded node-mate, when bytes count and it has one.
    uint32_t mate = kUnplaced;
    if (node_aware && p_.cluster.ranks_per_node > 1) {
      const uint32_t first = node(top) * p_.cluster.ranks_per_node;
      for (uint32_t r = first; r < first + p_.cluster.ranks_per_node; ++r) {
        if (r != top && (mate == kUnplaced || cost(r) < cost(mate))) mate = r;
      }
      if (std::find(targets.begin(), targets.end(), mate) == targets.end()) {
        targets.push_back(mate);
      }
    }
    double best = peak * (1 - 1e-12);
    uint32_t best_d = kUnplaced, best_e = kUnplaced, best_t = 0, best_q = 0;
    // kFewest: the best change so far is free (adds no bytes; then ranked by
    // the peak it leaves, `best`) or not (ranked by bytes per unit of peak
    // taken off down to stop_at, `best_key`).
    bool best_free = false;
    double best_key = 0;
    auto better = [&](double delta, double v) {
      if (!(v < peak * (1 - 1e-12))) return false;
      if (!fewest) return v < best;
      const bool free = delta <= 0;
      const double key = free ? v : delta / (peak - std::max(v, stop_at));
      if (best_d != kUnplaced && !free && best_free) return false;
      if (best_d != kUnplaced && free == best_free && !(key < best_key)) return false;
      best_free = free, best_key = key;
      return true;
    };
    // Top's documents' bytes where they are, read once a step.
    here.clear();
    if (node_aware) {
      for (uint32_t d : members_[top]) here.push_back(static_cast<double>(Bytes(d, node(top))));
    }
    for (uint32_t t : targets) {
      for (size_t k = 0; k < members_[top].size(); ++k) {
        const uint32_t d = members_[top][k];
        uint32_t q;
        double add;
        if (cost(t) + cost_[d] * min_add >= peak || !Best(t, d, &q, &add)) continue;
        const double rm = state_.RemoveDelta(top, seq_[d], p_.docs[d].tokens, cost_[d]);
        const double v = std::max(peak - rm, cost(t) + add);
        if (!(v < peak * (1 - 1e-12))) continue;
        const double delta = node_aware ? Bytes(d, node(t)) - here[k] : 0.0;
        if (mode == ByteRule::kNone && delta > 0) continue;
        if (better(delta, v)) best = v, best_d = d, best_e = kUnplaced, best_t = t, best_q = q;
      }
    }
    // Bytes between nodes a swap of d (on top) with e (on t) adds.
    auto swap_bytes = [&](uint32_t d, uint32_t e, uint32_t t) {
      return static_cast<double>(Bytes(d, node(t))) + Bytes(e, node(top)) - Bytes(d, node(top)) -
             Bytes(e, node(t));
    };
    // The swap of d (on top) with e (on t), kept if it is the best so far.
    auto consider_swap = [&](uint32_t d, uint32_t e, uint32_t t, double delta) {
      double dt, dtop;
      if (!state_.ReplaceDelta(t, seq_[e], p_.docs[e].tokens, cost_[e], p_.docs[d].tokens, cost_[d],
                               &dt, p_.docs[e].image_tokens, p_.docs[d].image_tokens) ||
          !state_.ReplaceDelta(top, seq_[d], p_.docs[d].tokens, cost_[d], p_.docs[e].tokens,
                               cost_[e], &dtop, p_.docs[d].image_tokens, p_.docs[e].image_tokens)) {
        return;
      }
      const double v = std::max(peak + dtop, cost(t) + dt);
      if (better(delta, v)) best = v, best_d = d, best_e = e, best_t = t;
    };
    if (fewest && !p_.padded && (best_d == kUnplaced || !best_free)) {
      // Unpadded costs add up: swapping d (top) with a cheaper e of its
      // modality on t lowers top by c_d - c_e and raises t as much, best
      // when that is half their gap. Partners by cost on the least loaded
      // ranks and top's least loaded node-mate.
      swap_targets.clear();
      for (auto it = ordered_.begin(); it != ordered_.end() && swap_targets.size() < kSortedSwaps;
           ++it) {
        if (it->second != top) swap_targets.push_back(it->second);
      }
      // And the last target: top's node-mate when it was added above (none
      // may have been found with one rank per node).
      if (node_aware && !targets.empty() && targets.back() != top &&
          std::find(swap_targets.begin(), swap_targets.end(), targets.back()) ==
              swap_targets.end()) {
        swap_targets.push_back(targets.back());
      }
      for (uint32_t t : swap_targets) {
        const double gap = peak - cost(t);
        by_cost_.clear();
        for (uint32_t e : members_[t]) by_cost_.push_back({p_.docs[e].vl, cost_[e], e});
        std::sort(by_cost_.begin(), by_cost_.end());
        for (uint32_t d : members_[top]) {
          const bool vl = p_.docs[d].vl;
          const auto k = std::lower_bound(by_cost_.begin(), by_cost_.end(),
                                          SortedDoc{vl, cost_[d] - gap / 2, 0});
          for (auto c = k - std::min<ptrdiff_t>(2, k - by_cost_.begin());
               c != by_cost_.end() && c < k + 2; ++c) {
            const uint32_t e = c->doc;
            if (c->vl != vl || !(c->cost < cost_[d])) continue;
            if (!(std::max(peak - (cost_[d] - c->cost), cost(t) + cost_[d] - c->cost) <
                  peak * (1 - 1e-12))) {
              continue;
            }
            consider_swap(d, e, t, swap_bytes(d, e, t));
          }
        }
      }
    }
    uint32_t checks = 0;
    for (uint32_t t : targets) {
      if ((best_d != kUnplaced && (!fewest || best_free || !p_.padded)) || checks > kSwapChecks) {
        break;
      }
      for (uint32_t d : members_[top]) {
        if (checks > kSwapChecks) break;
        for (uint32_t e : members_[t]) {
          if (++checks > kSwapChecks) break;
          if (p_.docs[e].vl != p_.docs[d].vl || p_.docs[e].tokens >= p_.docs[d].tokens) continue;
          const double delta = swap_bytes(d, e, t);
          if (mode == ByteRule::kNone && delta > 0) continue;
          consider_swap(d, e, t, delta);
        }
      }
    }
    if (best_d == kUnplaced) break;
    MoveOrSwap(best_d, best_e, best_t, best_q, top);
  }
  ordered_active_ = false;
}

// Moves d into e's rank and e out of it, to the first rank that takes it
// within the bound among: d's old rank, the other ranks of d's old node, the
// other ranks of e's node, skipping nodes where e's bytes would exceed
// `e_max_bytes`. Keeps the change only if every touched rank stays within the
// bound; otherwise restores everything.
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
                                   cost_[d], &dt, p_.docs[e].image_tokens,
                                   p_.docs[d].image_tokens) ||
              !state_.ReplaceDelta(top, seq_[d], p_.docs[d].tokens, cost_[d], p_.docs[e].tokens,
                                   cost_[e], &dtop, p_.docs[d].image_tokens,
                                   p_.docs[e].image_tokens) ||
              !Within(cost(t) + dt, bound)) {
            continue;
          }
          if (peak + dtop < best) best = peak + dtop, best_d = d, best_e = e, best_t = t;
        }
      }
    }
    if (best_d == kUnplaced) return false;
    MoveOrSwap(best_d, best_e, best_t, best_q, top);
  }
}

void Placer::MoveOrSwap(uint32_t d, uint32_t e, uint32_t t, uint32_t q, uint32_t top) {
  if (e == kUnplaced) {
    Unplace(d);
    Place(d, t, q);
    return;
  }
  const uint32_t qd = seq_[d], qe = seq_[e];
  Unplace(d);
  Unplace(e);
  Place(d, t, qe);
  Place(e, top, qd);
}

void Placer::ImproveLocality(double bound) {
  if (p_.affinity.empty()) return;
  // Work budget in candidate partners looked at, proportional to the docs.
  const uint64_t docs = p_.docs.size();
  uint64_t budget = (docs <= kRepairDocs ? 16 : 4) * docs + 4096;
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
        const LlmDoc& dd = p_.docs[d];
        // Unpadded: the most cost an ejected doc can take to the ranks
        // TryEject offers it (d's rank once d is out, d's node, node n).
        const uint32_t rpn = p_.cluster.ranks_per_node;
        double headroom = bound - (cost(rank_[d]) - cost_[d]);
        for (uint32_t nd : {node(rank_[d]), n}) {
          for (uint32_t r3 = nd * rpn; r3 < (nd + 1) * rpn; ++r3) {
            headroom = std::max(headroom, bound - cost(r3));
          }
        }
        for (uint32_t r2 = first; r2 < first + p_.cluster.ranks_per_node && !done; ++r2) {
          // Unpadded costs add up: e must free at least `need`.
          const double need = cost(r2) + cost_[d] - bound;
          const uint32_t room = state_.room(r2, dd.vl);
          others = members_[r2];
          for (uint32_t e : others) {
            if (budget == 0) break;
            --budget;
            const LlmDoc& ed = p_.docs[e];
            if (!p_.padded && (cost_[e] < need || cost_[e] > headroom)) continue;
            // d must fit once e is out.
            if (dd.tokens > room &&
                (ed.vl != dd.vl ||
                 state_.tokens(r2, seq_[e]) - ed.tokens + dd.tokens > p_.slots.seq_len)) {
              continue;
            }
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
        if (p_.docs.size() <= kRepairDocs && p_.cluster.world_size <= kRepairRanks) {
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

}  // namespace tutti::dispatch::internal
