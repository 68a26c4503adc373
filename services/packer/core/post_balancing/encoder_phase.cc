#include "services/packer/core/post_balancing/encoder_phase.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <queue>
#include <set>
#include <tuple>

#include "services/packer/core/post_balancing/balance.h"
#include "services/packer/core/post_balancing/min_tree.h"

namespace tutti::dispatch {
namespace {

constexpr uint32_t kNone = ~0u;

bool Within(double cost, double bound) { return cost <= bound + 1e-9 * std::abs(bound); }

// Local search on the makespan that keeps every item where its input is
// staged (or remote already); true if it ends within `bound`.
bool ImproveStaged(const EncoderProblem& p, double bound, uint32_t rounds,
                   std::vector<uint32_t>* rank) {
  const auto staged_ok = [&](uint32_t i, uint32_t to) {
    return p.Staged(i, p.cluster.node_of(to)) || !p.Staged(i, p.cluster.node_of((*rank)[i]));
  };
  const double span = ImproveMakespan(p.cost, p.cluster.world_size, rounds, rank, staged_ok);
  return Within(span, bound);
}

}  // namespace

void ImproveWithinNodes(const EncoderProblem& p, uint32_t rounds, std::vector<uint32_t>* rank,
                        const std::vector<uint8_t>* only) {
  const uint32_t rpn = p.cluster.ranks_per_node, W = p.cluster.world_size;
  if (rpn <= 1) return;
  // Each rank's items with their costs beside them (the searches below
  // read them many times). Kept across calls on this thread (fresh lists
  // every call would be thousands of allocations a step at W = 2560).
  struct Item {
    double cost;
    uint32_t i;
    // By cost, ties by index.
    bool operator<(const Item& o) const { return cost != o.cost ? cost < o.cost : i < o.i; }
  };
  thread_local std::vector<std::vector<Item>> members;
  if (members.size() < W) members.resize(W);
  for (uint32_t r = 0; r < W; ++r) members[r].clear();
  std::vector<double> load(W, 0.0);
  for (uint32_t i = 0; i < rank->size(); ++i) {
    members[(*rank)[i]].push_back({p.cost[i], i});
    load[(*rank)[i]] += p.cost[i];
  }
  thread_local std::vector<Item> lo_sorted;
  for (uint32_t n = 0; n < p.cluster.nodes(); ++n) {
    if (only != nullptr && !(*only)[n]) continue;
    const uint32_t first = n * rpn;
    for (uint32_t step = 0; step < rounds * rpn; ++step) {
      uint32_t hi = first, lo = first;
      for (uint32_t r = first + 1; r < first + rpn; ++r) {
        if (load[r] > load[hi]) hi = r;
        if (load[r] < load[lo]) lo = r;
      }
      const double gap = load[hi] - load[lo];
      if (gap <= 1e-4 * load[hi]) break;
      // Shift d from hi to lo (0 < d < gap); best is d closest to gap / 2,
      // by moving one item or swapping one of hi's with a smaller one of lo's.
      lo_sorted = members[lo];
      std::sort(lo_sorted.begin(), lo_sorted.end());
      double best = gap;  // |d - gap/2| must beat gap/2 to help
      uint32_t bi = ~0u, bj = ~0u;
      auto consider = [&](uint32_t i, uint32_t j, double d) {
        if (d <= 0 || d >= gap) return;
        const double miss = std::abs(d - gap / 2);
        if (miss < best) best = miss, bi = i, bj = j;
      };
      for (const Item& x : members[hi]) {
        consider(x.i, ~0u, x.cost);
        const double want = x.cost - gap / 2;
        auto it = std::lower_bound(lo_sorted.begin(), lo_sorted.end(), want,
                                   [](const Item& y, double v) { return y.cost < v; });
        if (it != lo_sorted.end()) consider(x.i, it->i, x.cost - it->cost);
        if (it != lo_sorted.begin()) consider(x.i, (it - 1)->i, x.cost - (it - 1)->cost);
      }
      if (bi == ~0u) break;
      auto move = [&](uint32_t item, uint32_t from, uint32_t to) {
        auto& m = members[from];
        m.erase(std::find_if(m.begin(), m.end(), [&](const Item& y) { return y.i == item; }));
        members[to].push_back({p.cost[item], item});
        load[from] -= p.cost[item];
        load[to] += p.cost[item];
        (*rank)[item] = to;
      };
      move(bi, hi, lo);
      if (bj != ~0u) move(bj, lo, hi);
    }
  }
}

std::vector<uint32_t> BalanceEncoder(const EncoderProblem& problem, uint32_t kk_max_ranks,
                                     uint32_t rounds) {
  return BalancePartition(problem.cost, problem.cluster.world_size, kk_max_ranks, rounds);
}

std::vector<uint32_t> GreedyEncoderNodeAware(const EncoderProblem& p, double bound, uint32_t rounds,
                                             bool* within_out) {
  const uint32_t W = p.cluster.world_size, N = p.cluster.nodes(), rpn = p.cluster.ranks_per_node;
  const size_t n = p.cost.size();
  std::vector<uint32_t> rank(n, 0);
  // Groups (samples) in decreasing total cost; items of a group likewise.
  std::vector<std::pair<uint32_t, uint32_t>> groups;  // [begin, end)
  for (uint32_t i = 0; i < n; ++i) {
    if (i == 0 || p.group[i] != p.group[i - 1]) groups.push_back({i, i});
    groups.back().second = i + 1;
  }
  std::vector<double> group_cost(groups.size(), 0.0);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (uint32_t i = groups[g].first; i < groups[g].second; ++i) group_cost[g] += p.cost[i];
  }
  // Decreasing cost, ties by index (a stable sort's order), sorted with the
  // costs beside the indices rather than looked up.
  std::vector<std::pair<double, uint32_t>> keyed(groups.size());
  for (uint32_t g = 0; g < groups.size(); ++g) keyed[g] = {group_cost[g], g};
  std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<uint32_t> order(groups.size());
  for (size_t k = 0; k < keyed.size(); ++k) order[k] = keyed[k].second;

  std::vector<double> rank_load(W, 0.0), node_load(N, 0.0);
  MinTree rank_tree(&rank_load), node_tree(&node_load);
  // The rank tree is needed only when a group spills off its node: ranks
  // whose load changed are re-read then.
  std::vector<uint8_t> dirty(W, 0);
  std::vector<uint32_t> dirty_list;
  auto least_rank = [&] {
    for (uint32_t r : dirty_list) rank_tree.Update(r), dirty[r] = 0;
    dirty_list.clear();
    return rank_tree.Min();
  };
  // The node tree likewise: with restricted staging only a shard staged
  // nowhere asks it.
  std::vector<uint8_t> node_dirty(N, 0);
  std::vector<uint32_t> node_dirty_list;
  auto least_node = [&] {
    for (uint32_t nd : node_dirty_list) node_tree.Update(nd), node_dirty[nd] = 0;
    node_dirty_list.clear();
    return node_tree.Min();
  };
  const bool everywhere = p.availability == nullptr || p.availability->all();
  std::optional<StagingIndex> own_index;
  const StagingIndex* staging = p.staging;
  if (!everywhere && staging == nullptr) staging = &own_index.emplace(*p.availability);
  auto least_in_node = [&](uint32_t node, double c) {
    uint32_t best = kNone;
    for (uint32_t r = node * rpn; r < (node + 1) * rpn; ++r) {
      if (Within(rank_load[r] + c, bound) && (best == kNone || rank_load[r] < rank_load[best])) {
        best = r;
      }
    }
    return best;
  };
  bool within = true;
  std::vector<uint32_t> items;
  for (uint32_t g : order) {
    const uint32_t first = groups[g].first;
    uint32_t home = kNone;
    if (everywhere) {
      home = least_node();
    } else {
      for (const uint32_t* nd = staging->begin(p.shard[first]); nd != staging->end(p.shard[first]);
           ++nd) {
        if (home == kNone || node_load[*nd] < node_load[home]) home = *nd;
      }
      if (home == kNone) home = least_node();
    }
    items.clear();
    for (uint32_t i = first; i < groups[g].second; ++i) items.push_back(i);
    for (size_t k = 1; k < items.size(); ++k) {  // insertion sort: a sample has few items
      for (size_t m = k; m > 0 && p.cost[items[m]] > p.cost[items[m - 1]]; --m) {
        std::swap(items[m], items[m - 1]);
      }
    }
    for (uint32_t i : items) {
      const double c = p.cost[i];
      uint32_t r = least_in_node(home, c);
      if (r == kNone) {
        if (everywhere) {
          const uint32_t t = least_rank();
          if (Within(rank_load[t] + c, bound)) r = t;
        } else {
          for (const uint32_t* ni = staging->begin(p.shard[i]); ni != staging->end(p.shard[i]);
               ++ni) {
            const uint32_t nd = *ni;
            const uint32_t t = least_in_node(nd, c);
            if (t != kNone && (r == kNone || rank_load[t] < rank_load[r])) r = t;
          }
        }
      }
      if (r == kNone) {
        r = least_rank();
        if (!Within(rank_load[r] + c, bound)) within = false;
      }
      rank[i] = r;
      rank_load[r] += c;
      node_load[p.cluster.node_of(r)] += c;
      if (!dirty[r]) dirty[r] = 1, dirty_list.push_back(r);
    }
    // The group's nodes: usually just `home`.
    for (uint32_t i : items) {
      const uint32_t nd = p.cluster.node_of(rank[i]);
      if (!node_dirty[nd]) node_dirty[nd] = 1, node_dirty_list.push_back(nd);
    }
  }
  ImproveWithinNodes(p, rounds, &rank);
  *within_out = within;
  return rank;
}

EncoderPlacement PlaceEncoder(const EncoderProblem& p, bool node_aware, double tolerance,
                              uint32_t kk_max_ranks, uint32_t rounds) {
  const uint32_t W = p.cluster.world_size;
  const double lb = MakespanLowerBound(p.cost, W);
  EncoderPlacement out;
  if (node_aware) {
    bool within = false;
    out.bound = (1 + tolerance) * lb;
    out.rank = GreedyEncoderNodeAware(p, out.bound, rounds, &within);
    if (within || ImproveStaged(p, out.bound, rounds, &out.rank)) return out;
    out.fell_back = true;
  }
  out.rank = BalanceEncoder(p, kk_max_ranks, rounds);
  out.bound = (1 + tolerance) * std::max(Makespan(p.cost, W, out.rank), lb);
  if (!node_aware) return out;
  // The balancer's makespan plus the tolerance may leave the greedy room.
  bool within = false;
  std::vector<uint32_t> retry = GreedyEncoderNodeAware(p, out.bound, rounds, &within);
  if (within || ImproveStaged(p, out.bound, rounds, &retry)) {
    out.rank = std::move(retry);
    return out;
  }
  // Pull remote loads onto a staging node where the bound allows.
  const size_t n = p.cost.size();
  std::vector<uint32_t> preferred(n, kNoNode);
  std::vector<uint64_t> weight(n, 0);
  for (uint32_t i = 0; i < n; ++i) {
    if (p.Staged(i, p.cluster.node_of(out.rank[i]))) continue;
    for (uint32_t nd = 0; nd < p.cluster.nodes(); ++nd) {
      if (p.Staged(i, nd)) {
        preferred[i] = nd;
        break;
      }
    }
    weight[i] = 1;
  }
  MoveTowardNodes(p, preferred, weight, out.bound, &out.rank);
  return out;
}

std::vector<uint8_t> MoveTowardNodes(const EncoderProblem& p,
                                     const std::vector<uint32_t>& preferred,
                                     const std::vector<uint64_t>& weight, double bound,
                                     std::vector<uint32_t>* rank) {
  std::vector<uint8_t> touched(p.cluster.nodes(), 0);
  const uint32_t rpn = p.cluster.ranks_per_node;
  std::vector<double> load = BinLoads(p.cost, p.cluster.world_size, *rank);
  auto node = [&](uint32_t i) { return p.cluster.node_of((*rank)[i]); };
  auto wants = [&](uint32_t i) { return preferred[i] != kNoNode && preferred[i] != node(i); };
  // May item i go to node nd without losing a local load?
  auto allowed = [&](uint32_t i, uint32_t nd) { return p.Staged(i, nd) || !p.Staged(i, node(i)); };
  std::vector<uint32_t> cands;
  for (uint32_t i = 0; i < rank->size(); ++i) {
    if (wants(i)) cands.push_back(i);
  }
  std::stable_sort(cands.begin(), cands.end(),
                   [&](uint32_t a, uint32_t b) { return weight[a] > weight[b]; });
  // Misplaced items by (current node, preferred node), for mutual swaps.
  std::map<std::pair<uint32_t, uint32_t>, std::vector<uint32_t>> buckets;
  for (uint32_t i : cands) buckets[{node(i), preferred[i]}].push_back(i);
  constexpr uint32_t kSwapTries = 64;
  for (uint32_t i : cands) {
    if (!wants(i)) continue;
    const uint32_t to = preferred[i], from = node(i);
    if (!allowed(i, to)) continue;
    const double c = p.cost[i];
    uint32_t best = kNone;
    for (uint32_t r = to * rpn; r < (to + 1) * rpn; ++r) {
      if (Within(load[r] + c, bound) && (best == kNone || load[r] < load[best])) best = r;
    }
    if (best != kNone) {
      load[(*rank)[i]] -= c;
      load[best] += c;
      touched[from] = touched[to] = 1;
      (*rank)[i] = best;
      continue;
    }
    auto it = buckets.find({to, from});
    if (it == buckets.end()) continue;
    uint32_t tries = 0;
    for (uint32_t j : it->second) {
      if (++tries > kSwapTries) break;
      if (!wants(j) || node(j) != to || preferred[j] != from || !allowed(j, from)) continue;
      const uint32_t ri = (*rank)[i], rj = (*rank)[j];
      const double cj = p.cost[j];
      if (!Within(load[ri] - c + cj, bound) || !Within(load[rj] - cj + c, bound)) continue;
      load[ri] += cj - c;
      load[rj] += c - cj;
      (*rank)[i] = rj;
      (*rank)[j] = ri;
      touched[from] = touched[to] = 1;
      break;
    }
  }
  return touched;
}

double RebalanceFewestBytes(const EncoderProblem& p, const std::vector<uint32_t>& preferred,
                            const std::vector<uint64_t>& weight,
                            const std::vector<uint64_t>& load_weight, double target,
                            uint32_t rounds, std::vector<uint32_t>* rank) {
  const uint32_t W = p.cluster.world_size, rpn = p.cluster.ranks_per_node;
  std::vector<double> load = BinLoads(p.cost, W, *rank);
  if (W <= 1 || Within(*std::max_element(load.begin(), load.end()), target)) {
    return load.empty() ? 0 : *std::max_element(load.begin(), load.end());
  }
  // Every rank's items by increasing cost, with what their bytes depend on
  // (read in every step: kept beside the cost, not looked up), kept so as
  // they move.
  struct Entry {
    double cost;
    uint32_t item;
    uint32_t preferred;
    uint32_t shard;
    uint32_t home;  // home_of(shard)
    double weight, load_weight;
    bool operator<(const Entry& o) const { return cost != o.cost ? cost < o.cost : item < o.item; }
  };
  const bool everywhere = p.availability == nullptr || p.availability->all();
  // Where a shard is staged, for the bytes below: its one staging node, or
  // kNone (nowhere), or kSeveral (then the bitmap is asked).
  constexpr uint32_t kSeveral = kNone - 1;
  auto home_of = [&](uint32_t shard) {
    if (everywhere || p.staging == nullptr) return kSeveral;
    if (shard >= p.availability->shards()) return kNone;
    const uint32_t *b = p.staging->begin(shard), *e = p.staging->end(shard);
    return e == b ? kNone : e - b == 1 ? *b : kSeveral;
  };
  auto entry = [&](uint32_t i) {
    return Entry{p.cost[i],
                 i,
                 preferred[i],
                 p.shard[i],
                 home_of(p.shard[i]),
                 static_cast<double>(weight[i]),
                 static_cast<double>(load_weight[i])};
  };
  // Kept across calls on this thread: a W = 2560 step lists 200,000 items,
  // and fresh lists every step would be fresh pages every step.
  thread_local std::vector<std::vector<Entry>> members;
  if (members.size() < W) members.resize(W);
  for (uint32_t r = 0; r < W; ++r) members[r].clear();
  for (uint32_t i = 0; i < rank->size(); ++i) members[(*rank)[i]].push_back(entry(i));
  // Sorted when first read: a step touches the slowest ranks and the least
  // loaded ones, not always all of them.
  std::vector<uint8_t> sorted(W, 0);
  auto list = [&](uint32_t r) -> std::vector<Entry>& {
    if (!sorted[r]) std::sort(members[r].begin(), members[r].end()), sorted[r] = 1;
    return members[r];
  };
  std::vector<double> node_load(p.cluster.nodes(), 0.0);
  for (uint32_t r = 0; r < W; ++r) node_load[p.cluster.node_of(r)] += load[r];
  std::set<std::pair<double, uint32_t>> order;  // (load, rank)
  for (uint32_t r = 0; r < W; ++r) order.insert({load[r], r});
  auto node = [&](uint32_t r) { return p.cluster.node_of(r); };
  // Bytes of an item while on node n: its output off its preferred node,
  // its input where its shard is not staged (a remote load).
  auto staged = [&](const Entry& x, uint32_t n) {
    return everywhere || x.home == n || (x.home == kSeveral && p.availability->Has(x.shard, n));
  };
  auto bytes = [&](const Entry& x, uint32_t n) {
    return (x.preferred != kNoNode && x.preferred != n ? x.weight : 0.0) +
           (staged(x, n) ? 0.0 : x.load_weight);
  };
  auto set_load = [&](uint32_t r, double v) {
    order.erase({load[r], r});
    node_load[node(r)] += v - load[r];
    load[r] = v;
    order.insert({v, r});
  };
  auto move = [&](uint32_t i, uint32_t from, uint32_t to) {
    const Entry e = entry(i);
    auto& m = list(from);
    m.erase(std::lower_bound(m.begin(), m.end(), e));
    auto& n = list(to);
    n.insert(std::lower_bound(n.begin(), n.end(), e), e);
    (*rank)[i] = to;
  };
  constexpr uint32_t kTargets = 8, kWideTargets = 64;
  std::vector<uint32_t> targets;
  std::vector<double> here;
  const uint64_t max_steps = uint64_t{rounds} * W;
  for (uint64_t step = 0; step < max_steps; ++step) {
    const uint32_t top = order.rbegin()->second;
    const double peak = load[top];
    if (Within(peak, target)) break;
    const uint32_t ntop = node(top);
    // The best change so far: free ones (no bytes added) by the load they
    // leave, then the others by bytes per unit of makespan taken off.
    bool found = false, best_free = false;
    double best_key = 0, best_v = 0;
    uint32_t bi = 0, bj = kNone, bt = 0;
    auto consider = [&](double delta, double v, uint32_t i, uint32_t j, uint32_t t) {
      if (!(v < peak * (1 - 1e-12))) return;
      const bool free = delta <= 0;
      const double key = free ? v : delta / (peak - std::max(v, target));
      const bool better =
          !found || (free && !best_free) ||
          (free == best_free && (key < best_key || (key == best_key && v < best_v)));
      if (better)
        found = true, best_free = free, best_key = key, best_v = v, bi = i, bj = j, bt = t;
    };
    const std::vector<Entry>& mine = list(top);
    // Top's items' bytes where they are, read once a step.
    here.resize(mine.size());
    for (size_t k = 0; k < mine.size(); ++k) here[k] = bytes(mine[k], ntop);
    // Moves, then (if none lowers the pair) swaps of i (top) with a smaller
    // j (t): top drops by d = c_i - c_j, t rises by d; the best d is the one
    // closest to half their gap. Both lists ascend, so the partners are
    // found in one walk.
    auto search = [&] {
      for (uint32_t t : targets) {
        const uint32_t nt = node(t);
        for (size_t m = 0; m < mine.size(); ++m) {
          const Entry& x = mine[m];
          if (load[t] + x.cost >= peak) break;  // no later (larger) item lowers the pair
          consider(bytes(x, nt) - here[m], std::max(peak - x.cost, load[t] + x.cost), x.item, kNone,
                   t);
        }
      }
      if (found) return;
      for (uint32_t t : targets) {
        const uint32_t nt = node(t);
        const double gap = peak - load[t];
        const std::vector<Entry>& theirs = list(t);
        size_t k = 0;
        for (size_t m = 0; m < mine.size(); ++m) {
          const Entry& x = mine[m];
          const double want = x.cost - gap / 2;
          while (k < theirs.size() && theirs[k].cost < want) ++k;
          for (size_t c : {k, k > 0 ? k - 1 : k}) {
            if (c >= theirs.size()) continue;
            const Entry& y = theirs[c];
            const double d = x.cost - y.cost;
            if (d <= 0) continue;
            const double delta = bytes(x, nt) + bytes(y, ntop) - here[m] - bytes(y, nt);
            consider(delta, std::max(peak - d, load[t] + d), x.item, y.item, t);
          }
        }
      }
    };
    // While top's node holds no more than target a rank, changes inside it
    // (free) can do; otherwise load must leave the node: to the least loaded
    // ranks elsewhere.
    targets.clear();
    if (node_load[ntop] <= target * rpn) {
      // The node's two least loaded other ranks: the widest gaps to top.
      uint32_t a = kNone, b = kNone;
      for (uint32_t r = ntop * rpn; r < (ntop + 1) * rpn; ++r) {
        if (r == top) continue;
        if (a == kNone || load[r] < load[a]) {
          b = a, a = r;
        } else if (b == kNone || load[r] < load[b]) {
          b = r;
        }
      }
      for (uint32_t r : {a, b}) {
        if (r != kNone) targets.push_back(r);
      }
      search();
    }
    // When none of the few least loaded ranks takes a change (few items a
    // rank), the next ones may: up to kWideTargets.
    for (uint32_t want : {kTargets, kWideTargets}) {
      if (found) break;
      targets.clear();
      uint32_t far = 0;
      for (auto it = order.begin(); it != order.end() && far < want; ++it) {
        if (node(it->second) == ntop) continue;
        if (far++ >= (want == kTargets ? 0 : kTargets)) targets.push_back(it->second);
      }
      search();
    }
    if (!found) break;
    double top_load = load[top] - p.cost[bi], t_load = load[bt] + p.cost[bi];
    move(bi, top, bt);
    if (bj != kNone) {
      move(bj, bt, top);
      top_load += p.cost[bj];
      t_load -= p.cost[bj];
    }
    set_load(top, top_load);
    set_load(bt, t_load);
  }
  return order.rbegin()->first;
}

}  // namespace tutti::dispatch
