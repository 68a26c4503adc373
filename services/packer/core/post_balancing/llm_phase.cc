#include "services/packer/core/post_balancing/llm_phase.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "services/packer/core/post_balancing/llm_placer.h"

namespace tutti::dispatch {

using internal::kPortfolioDocs;
using internal::kUnplaced;
using internal::Placer;
using internal::Within;

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
  // LPT; if some document finds no room, LPT with tight sequences; then
  // best-fit decreasing packing, balanced afterwards by local search.
  const double stop_at = LlmLowerBound(problem) * (1 + 1e-6);
  uint32_t bad = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    Placer placer(problem);
    placer.set_tight_fit(attempt > 0);
    const Placer::Order order = attempt == 2 ? Placer::Order::kPackFirst : Placer::Order::kLpt;
    bool within;
    if (!placer.Greedy(order, false, std::numeric_limits<double>::infinity(), &within, &bad)) {
      continue;
    }
    placer.set_tight_fit(false);
    placer.ImproveBalance(false, attempt == 2 ? 4 * rounds : rounds, stop_at);
    return placer.Result();
  }
  const LlmDoc& d = problem.docs[bad];
  return absl::ResourceExhaustedError(absl::StrCat(
      "the step's documents do not fit its sequences: a ", d.vl ? "VL" : "text-only",
      " document of ", d.tokens, " tokens found no ", d.vl ? "VL" : "text", " sequence with room (",
      problem.cluster.world_size, " ranks x ",
      d.vl ? problem.slots.vl_sequences() : problem.slots.text_sequences(), " sequences of ",
      problem.slots.seq_len, " tokens); draw fewer samples per step or add sequences"));
}

absl::StatusOr<RearrangeResult> RearrangeLlm(const LlmProblem& problem, uint32_t rounds,
                                             double tolerance, const LlmAssignment* balanced,
                                             double target) {
  const double stop_at = LlmLowerBound(problem) * (1 + 1e-6);
  // Balance bought with bytes, down to the target.
  auto rebalance = [&](Placer* placer) {
    if (target > 0 && placer->Peak() > target) {
      placer->ImproveBalance(Placer::ByteRule::kFewest, rounds, target);
    }
  };
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
      rebalance(&placer);
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
  // Padded costs have a loose lower bound (Jensen over all sequences), which
  // the greedy practically never meets: go straight to the balancer's bound.
  if (!problem.padded && attempt(problem.bound, &out)) return out;
  // The bound is out of the greedy's reach: measure what balancing alone
  // reaches and allow the tolerance on top of that.
  LlmAssignment own;
  if (balanced == nullptr) {
    ASSIGN_OR_RETURN(own, BalanceLlm(problem, rounds));
    balanced = &own;
  }
  const auto cost = LlmRankCosts(problem, *balanced);
  const double raised =
      std::max(problem.bound, (1 + tolerance) * *std::max_element(cost.begin(), cost.end()));
  out.fell_back = true;
  if (attempt(raised, &out)) return out;
  Placer placer(problem);
  placer.Load(*balanced);
  placer.ImproveLocality(raised);
  placer.ImproveBalance(true, rounds, stop_at);
  rebalance(&placer);
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
    return absl::InternalError(
        absl::StrCat("assignment covers ", a.rank.size(), " docs, not ", problem.docs.size()));
  }
  std::vector<uint32_t> fill(size_t{W} * s.sequences(), 0);
  for (size_t d = 0; d < a.rank.size(); ++d) {
    if (a.rank[d] >= W || a.seq[d] >= s.sequences()) {
      return absl::InternalError(absl::StrCat("doc ", d, " placed on rank ", a.rank[d],
                                              " sequence ", a.seq[d], ": out of range"));
    }
    if (s.is_vl_sequence(a.seq[d]) != problem.docs[d].vl) {
      return absl::InternalError(
          absl::StrCat("doc ", d, " is in a sequence of the other modality"));
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
