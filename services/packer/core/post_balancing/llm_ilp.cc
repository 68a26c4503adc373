#include "services/packer/core/post_balancing/llm_ilp.h"

#include <glpk.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cost_model.h"

namespace tutti::dispatch {
namespace {

using Clock = std::chrono::steady_clock;

// Owns a glp_prob.
class GlpProblem {
 public:
  GlpProblem() : p_(glp_create_prob()) {}
  ~GlpProblem() { glp_delete_prob(p_); }
  GlpProblem(const GlpProblem&) = delete;
  GlpProblem& operator=(const GlpProblem&) = delete;
  glp_prob* get() const { return p_; }

 private:
  glp_prob* p_;
};

// What the branch-and-bound callback needs: the starting incumbent and the
// node budget.
struct SearchState {
  std::vector<double> x;  // 1-based column values of the start; empty: none
  bool offered = false;
  uint64_t nodes = 0;      // subproblems selected so far (all cut rounds)
  uint64_t max_nodes = 0;  // 0: no budget
  bool out_of_nodes = false;
};

void OnSearchEvent(glp_tree* tree, void* info) {
  auto* st = static_cast<SearchState*>(info);
  switch (glp_ios_reason(tree)) {
    case GLP_IHEUR:
      if (st->x.empty() || st->offered) return;
      st->offered = true;
      glp_ios_heur_sol(tree, st->x.data());
      return;
    case GLP_ISELECT:
      if (st->max_nodes > 0 && ++st->nodes > st->max_nodes) {
        st->out_of_nodes = true;
        glp_ios_terminate(tree);
      }
      return;
    default:
      return;
  }
}

uint64_t Gcd(uint64_t a, uint64_t b) { return std::gcd(a, b); }

}  // namespace

absl::StatusOr<IlpResult> SolveLlmIlp(const LlmProblem& p, const IlpOptions& o) {
  const Clock::time_point t0 = Clock::now();
  const SlotLayout& sl = p.slots;
  const uint32_t W = p.cluster.world_size, D = static_cast<uint32_t>(p.docs.size());
  const uint32_t S = sl.sequences(), M = sl.micro_batches();
  const CostModel model(p.cost);
  IlpResult result;

  // Columns: x for each (doc, rank, sequence of its modality), then z and y.
  uint64_t binaries = 0;
  for (const LlmDoc& d : p.docs)
    binaries += uint64_t{W} * (d.vl ? sl.vl_sequences() : sl.text_sequences());
  if (binaries > o.max_binaries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ILP reference would need ", binaries, " binary variables, above its limit of ",
        o.max_binaries, "; use it on a smaller instance"));
  }
  std::vector<uint32_t> first_col(D + 1, 1);
  for (uint32_t d = 0; d < D; ++d) {
    first_col[d + 1] = first_col[d] + W * (p.docs[d].vl ? sl.vl_sequences() : sl.text_sequences());
  }
  auto seq_begin = [&](uint32_t d) { return p.docs[d].vl ? sl.text_sequences() : 0u; };
  auto seq_count = [&](uint32_t d) {
    return p.docs[d].vl ? sl.vl_sequences() : sl.text_sequences();
  };
  auto col = [&](uint32_t d, uint32_t r, uint32_t q) {
    return first_col[d] + r * seq_count(d) + (q - seq_begin(d));
  };
  const int nx = static_cast<int>(first_col[D] - 1);
  const int z0 = nx + 1, y0 = nx + 1 + static_cast<int>(W * M);  // padded only
  const int ncols = p.padded ? nx + 2 * static_cast<int>(W * M) : nx;

  GlpProblem lp;
  glp_prob* g = lp.get();
  glp_set_obj_dir(g, GLP_MIN);
  glp_add_cols(g, ncols);
  uint64_t unit = 0;
  for (uint32_t d = 0; d < D; ++d) {
    for (uint32_t n = 0; n < p.cluster.nodes(); ++n) {
      unit = Gcd(unit, p.affinity.empty() ? 0 : p.affinity.Bytes(d, n));
    }
  }
  if (unit == 0) unit = 1;
  for (uint32_t d = 0; d < D; ++d) {
    for (uint32_t r = 0; r < W; ++r) {
      const double bytes =
          p.affinity.empty() ? 0.0 : double(p.affinity.Bytes(d, p.cluster.node_of(r)) / unit);
      for (uint32_t q = seq_begin(d); q < seq_begin(d) + seq_count(d); ++q) {
        glp_set_col_kind(g, col(d, r, q), GLP_BV);
        glp_set_obj_coef(g, col(d, r, q), bytes);
      }
    }
  }
  if (p.padded) {
    for (int j = z0; j <= ncols; ++j) glp_set_col_bnds(g, j, GLP_LO, 0.0, 0.0);
  }
  const double bound = p.bound;
  const bool bounded = std::isfinite(bound) && bound > 0;

  std::vector<int> ind;
  std::vector<double> val;
  auto add_row = [&](int type, double lo, double hi) {
    const int row = glp_add_rows(g, 1);
    glp_set_row_bnds(g, row, type, lo, hi);
    glp_set_mat_row(g, row, static_cast<int>(ind.size()) - 1, ind.data(), val.data());
  };
  auto reset = [&] {
    ind.assign(1, 0);
    val.assign(1, 0.0);
  };
  for (uint32_t d = 0; d < D; ++d) {  // every doc once
    reset();
    for (int j = static_cast<int>(first_col[d]); j < static_cast<int>(first_col[d + 1]); ++j) {
      ind.push_back(j), val.push_back(1.0);
    }
    add_row(GLP_FX, 1.0, 1.0);
  }
  for (uint32_t r = 0; r < W; ++r) {  // every sequence
    for (uint32_t q = 0; q < S; ++q) {
      reset();
      for (uint32_t d = 0; d < D; ++d) {
        if (sl.is_vl_sequence(q) != p.docs[d].vl) continue;
        ind.push_back(col(d, r, q)), val.push_back(p.docs[d].tokens);
      }
      if (ind.size() > 1) add_row(GLP_UP, 0.0, sl.seq_len);
      if (p.padded) {  // tokens - z <= 0
        ind.push_back(z0 + r * M + sl.micro_batch_of(q)), val.push_back(-1.0);
        add_row(GLP_UP, 0.0, 0.0);
      }
    }
  }
  const double a = p.cost.llm_linear, b = p.cost.llm_quadratic;
  const double scale = bounded ? bound : 1.0;
  // Tangent of size*Llm at L: y/scale >= size*(a + 2bL) z/scale - size*b*L^2/scale.
  std::set<std::pair<uint32_t, uint32_t>> cut_at;  // (rank*M + mb, L)
  auto add_cut = [&](uint32_t r, uint32_t mb, uint32_t L) {
    if (!cut_at.insert({r * M + mb, L}).second) return false;
    const double n = sl.micro_batch_size(mb);
    reset();
    ind.push_back(z0 + r * M + mb), val.push_back(n * (a + 2 * b * L) / scale);
    ind.push_back(y0 + r * M + mb), val.push_back(-1.0);
    add_row(GLP_UP, 0.0, n * b * double(L) * L / scale);
    return true;
  };
  const uint32_t tangents = std::max(2u, o.tangents);
  for (uint32_t r = 0; r < W && bounded; ++r) {  // every rank's cost
    if (p.padded) {
      for (uint32_t mb = 0; mb < M; ++mb) {
        for (uint32_t k = 0; k < tangents; ++k) {
          add_cut(r, mb, static_cast<uint32_t>(uint64_t{sl.seq_len} * k / (tangents - 1)));
        }
      }
      reset();
      for (uint32_t mb = 0; mb < M; ++mb) ind.push_back(y0 + r * M + mb), val.push_back(1.0);
      add_row(GLP_UP, 0.0, 1.0);
    } else {
      reset();
      for (uint32_t d = 0; d < D; ++d) {
        for (uint32_t q = seq_begin(d); q < seq_begin(d) + seq_count(d); ++q) {
          ind.push_back(col(d, r, q)), val.push_back(model.Llm(p.docs[d].tokens) / scale);
        }
      }
      add_row(GLP_UP, 0.0, 1.0);
    }
  }

  SearchState start;
  start.max_nodes = o.max_nodes;
  if (o.start != nullptr && o.start->rank.size() == D) {
    start.x.assign(ncols + 1, 0.0);
    std::vector<uint32_t> fill(size_t{W} * S, 0);
    for (uint32_t d = 0; d < D; ++d) {
      start.x[col(d, o.start->rank[d], o.start->seq[d])] = 1.0;
      fill[size_t{o.start->rank[d]} * S + o.start->seq[d]] += p.docs[d].tokens;
    }
    if (p.padded) {
      for (uint32_t r = 0; r < W; ++r) {
        for (uint32_t q = 0; q < S; ++q) {
          double& z = start.x[z0 + r * M + sl.micro_batch_of(q)];
          z = std::max(z, double(fill[size_t{r} * S + q]));
        }
        for (uint32_t mb = 0; mb < M; ++mb) {
          start.x[y0 + r * M + mb] =
              sl.micro_batch_size(mb) * model.Llm(start.x[z0 + r * M + mb]) / scale;
        }
      }
    }
  }

  glp_term_out(GLP_OFF);
  auto left_ms = [&] {
    const double spent = std::chrono::duration<double>(Clock::now() - t0).count();
    return static_cast<int>(std::max(0.0, (o.time_limit_s - spent) * 1000.0));
  };
  for (uint32_t round = 0;; ++round) {
    result.cut_rounds = round;
    if (left_ms() <= 0) {
      result.detail = "time limit reached";
      break;
    }
    glp_smcp sp;
    glp_init_smcp(&sp);
    sp.msg_lev = GLP_MSG_OFF;
    sp.presolve = round == 0 ? GLP_ON : GLP_OFF;
    sp.tm_lim = left_ms();
    const int sret = glp_simplex(g, &sp);
    if (sret == GLP_ENOPFS || glp_get_status(g) == GLP_NOFEAS) {
      result.outcome = IlpOutcome::kInfeasible;
      break;
    }
    if (sret != 0 || glp_get_status(g) != GLP_OPT) {
      // The presolver may leave no basis; solve again without it.
      sp.presolve = GLP_OFF;
      sp.tm_lim = std::max(1, left_ms());
      if (glp_simplex(g, &sp) != 0 || glp_get_status(g) != GLP_OPT) {
        result.detail = absl::StrCat("LP relaxation not solved (glp_simplex ", sret, ")");
        break;
      }
    }
    glp_iocp ip;
    glp_init_iocp(&ip);
    ip.msg_lev = GLP_MSG_OFF;
    ip.presolve = GLP_OFF;
    ip.tm_lim = std::max(1, left_ms());
    ip.cb_func = OnSearchEvent;
    ip.cb_info = &start;
    start.offered = false;
    const int iret = glp_intopt(g, &ip);
    const int status = glp_mip_status(g);
    if (status == GLP_NOFEAS) {
      result.outcome = IlpOutcome::kInfeasible;
      break;
    }
    if (iret != 0 || status != GLP_OPT) {
      result.detail = iret == GLP_ETMLIM   ? "time limit reached"
                      : start.out_of_nodes ? absl::StrCat("node limit (", o.max_nodes, ") reached")
                                           : absl::StrCat("glp_intopt returned ", iret);
      break;
    }
    LlmAssignment sol{std::vector<uint32_t>(D, 0), std::vector<uint32_t>(D, 0)};
    for (uint32_t d = 0; d < D; ++d) {
      for (uint32_t r = 0; r < W; ++r) {
        for (uint32_t q = seq_begin(d); q < seq_begin(d) + seq_count(d); ++q) {
          if (glp_mip_col_val(g, col(d, r, q)) > 0.5) sol.rank[d] = r, sol.seq[d] = q;
        }
      }
    }
    // Padded: refine the cuts wherever the true cost exceeds the bound.
    bool refined = false;
    if (p.padded && bounded) {
      const auto cost = LlmRankCosts(p, sol);
      std::vector<uint32_t> fill(size_t{W} * S, 0);
      for (uint32_t d = 0; d < D; ++d)
        fill[size_t{sol.rank[d]} * S + sol.seq[d]] += p.docs[d].tokens;
      for (uint32_t r = 0; r < W; ++r) {
        if (cost[r] <= bound * (1 + 1e-9)) continue;
        for (uint32_t mb = 0; mb < M; ++mb) {
          uint32_t longest = 0;
          for (uint32_t q = sl.first_sequence(mb);
               q < sl.first_sequence(mb) + sl.micro_batch_size(mb); ++q) {
            longest = std::max(longest, fill[size_t{r} * S + q]);
          }
          refined |= add_cut(r, mb, longest);
        }
      }
      if (refined && round + 1 >= o.max_cut_rounds) {
        result.detail = "cut refinement did not converge";
        break;
      }
    }
    if (refined) continue;
    result.outcome = IlpOutcome::kOptimal;
    result.bytes = LlmInterNodeBytes(p, sol);
    result.assignment = std::move(sol);
    break;
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return result;
}

}  // namespace tutti::dispatch
