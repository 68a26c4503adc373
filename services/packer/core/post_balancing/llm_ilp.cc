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

// The integer program of llm_ilp.h for one problem, built in stages:
// columns and objective, the rows that hold for every placement (each doc
// once, sequence capacities), the rank cost bound (unpadded: one row per
// rank; padded: tangent cuts refined at each solution), a start incumbent,
// and the rounds of LP relaxation + branch and bound.
class IlpModel {
 public:
  IlpModel(const LlmProblem& p, const IlpOptions& o)
      : p_(p),
        o_(o),
        sl_(p.slots),
        W_(p.cluster.world_size),
        D_(static_cast<uint32_t>(p.docs.size())),
        S_(sl_.sequences()),
        M_(sl_.micro_batches()),
        model_(p.cost),
        bound_(p.bound),
        bounded_(std::isfinite(bound_) && bound_ > 0),
        scale_(bounded_ ? bound_ : 1.0) {}

  // Binary variables the program needs.
  uint64_t Binaries() const {
    uint64_t binaries = 0;
    for (const LlmDoc& d : p_.docs) binaries += uint64_t{W_} * SeqCount(d);
    return binaries;
  }

  // Columns: x for each (doc, rank, sequence of its modality), then, padded,
  // z (longest sequence) and y (cost) per (rank, micro-batch); the objective
  // is each x's inter-node bytes in units of their common divisor.
  void AddColumns() {
    first_col_.assign(D_ + 1, 1);
    for (uint32_t d = 0; d < D_; ++d) first_col_[d + 1] = first_col_[d] + W_ * SeqCount(p_.docs[d]);
    const int nx = static_cast<int>(first_col_[D_] - 1);
    z0_ = nx + 1;
    y0_ = nx + 1 + static_cast<int>(W_ * M_);
    ncols_ = p_.padded ? nx + 2 * static_cast<int>(W_ * M_) : nx;
    glp_prob* g = lp_.get();
    glp_set_obj_dir(g, GLP_MIN);
    glp_add_cols(g, ncols_);
    uint64_t unit = 0;
    for (uint32_t d = 0; d < D_; ++d) {
      for (uint32_t n = 0; n < p_.cluster.nodes(); ++n) {
        unit = std::gcd(unit, p_.affinity.empty() ? 0 : p_.affinity.Bytes(d, n));
      }
    }
    if (unit == 0) unit = 1;
    for (uint32_t d = 0; d < D_; ++d) {
      for (uint32_t r = 0; r < W_; ++r) {
        const double bytes =
            p_.affinity.empty() ? 0.0 : double(p_.affinity.Bytes(d, p_.cluster.node_of(r)) / unit);
        for (uint32_t q = SeqBegin(d); q < SeqBegin(d) + SeqCount(p_.docs[d]); ++q) {
          glp_set_col_kind(g, Col(d, r, q), GLP_BV);
          glp_set_obj_coef(g, Col(d, r, q), bytes);
        }
      }
    }
    if (p_.padded) {
      for (int j = z0_; j <= ncols_; ++j) glp_set_col_bnds(g, j, GLP_LO, 0.0, 0.0);
    }
  }

  // Every doc once; every sequence within seq_len (padded: and below its
  // micro-batch's z); every VL sequence's image tokens within img_cap.
  void AddPlacementRows() {
    for (uint32_t d = 0; d < D_; ++d) {
      Reset();
      for (int j = static_cast<int>(first_col_[d]); j < static_cast<int>(first_col_[d + 1]); ++j) {
        Push(j, 1.0);
      }
      AddRow(GLP_FX, 1.0, 1.0);
    }
    for (uint32_t r = 0; r < W_; ++r) {
      for (uint32_t q = 0; q < S_; ++q) {
        Reset();
        for (uint32_t d = 0; d < D_; ++d) {
          if (sl_.is_vl_sequence(q) != p_.docs[d].vl) continue;
          Push(Col(d, r, q), p_.docs[d].tokens);
        }
        if (ind_.size() > 1) AddRow(GLP_UP, 0.0, sl_.seq_len);
        if (p_.padded) {  // tokens - z <= 0
          Push(z0_ + r * M_ + sl_.micro_batch_of(q), -1.0);
          AddRow(GLP_UP, 0.0, 0.0);
        }
        if (sl_.img_cap > 0 && sl_.is_vl_sequence(q)) {  // image tokens within img_cap
          Reset();
          for (uint32_t d = 0; d < D_; ++d) {
            if (p_.docs[d].vl && p_.docs[d].image_tokens > 0) {
              Push(Col(d, r, q), p_.docs[d].image_tokens);
            }
          }
          if (ind_.size() > 1) AddRow(GLP_UP, 0.0, sl_.img_cap);
        }
      }
    }
  }

  // Every rank's LLM cost within the bound (when there is one).
  void AddCostRows() {
    const uint32_t tangents = std::max(2u, o_.tangents);
    for (uint32_t r = 0; r < W_ && bounded_; ++r) {
      if (p_.padded) {
        for (uint32_t mb = 0; mb < M_; ++mb) {
          for (uint32_t k = 0; k < tangents; ++k) {
            AddCut(r, mb, static_cast<uint32_t>(uint64_t{sl_.seq_len} * k / (tangents - 1)));
          }
        }
        Reset();
        for (uint32_t mb = 0; mb < M_; ++mb) Push(y0_ + r * M_ + mb, 1.0);
        AddRow(GLP_UP, 0.0, 1.0);
      } else {
        Reset();
        for (uint32_t d = 0; d < D_; ++d) {
          for (uint32_t q = SeqBegin(d); q < SeqBegin(d) + SeqCount(p_.docs[d]); ++q) {
            Push(Col(d, r, q), model_.Llm(p_.docs[d].tokens) / scale_);
          }
        }
        AddRow(GLP_UP, 0.0, 1.0);
      }
    }
  }

  // The start placement as column values (padded: with its z and y).
  void SetStart() {
    search_.max_nodes = o_.max_nodes;
    if (o_.start == nullptr || o_.start->rank.size() != D_) return;
    search_.x.assign(ncols_ + 1, 0.0);
    std::vector<uint32_t> fill(size_t{W_} * S_, 0);
    for (uint32_t d = 0; d < D_; ++d) {
      search_.x[Col(d, o_.start->rank[d], o_.start->seq[d])] = 1.0;
      fill[size_t{o_.start->rank[d]} * S_ + o_.start->seq[d]] += p_.docs[d].tokens;
    }
    if (!p_.padded) return;
    for (uint32_t r = 0; r < W_; ++r) {
      for (uint32_t q = 0; q < S_; ++q) {
        double& z = search_.x[z0_ + r * M_ + sl_.micro_batch_of(q)];
        z = std::max(z, double(fill[size_t{r} * S_ + q]));
      }
      for (uint32_t mb = 0; mb < M_; ++mb) {
        search_.x[y0_ + r * M_ + mb] =
            sl_.micro_batch_size(mb) * model_.Llm(search_.x[z0_ + r * M_ + mb]) / scale_;
      }
    }
  }

  // Rounds of LP relaxation and branch and bound until the optimum holds
  // exactly (padded: no rank's true cost above the bound), or a budget ends.
  void Solve(Clock::time_point t0, IlpResult* result) {
    glp_term_out(GLP_OFF);
    auto left_ms = [&] {
      const double spent = std::chrono::duration<double>(Clock::now() - t0).count();
      return static_cast<int>(std::max(0.0, (o_.time_limit_s - spent) * 1000.0));
    };
    for (uint32_t round = 0;; ++round) {
      result->cut_rounds = round;
      if (left_ms() <= 0) {
        result->detail = "time limit reached";
        return;
      }
      if (!SolveRelaxation(round, left_ms, result) || !SolveInteger(left_ms, result)) return;
      LlmAssignment sol = Solution();
      if (p_.padded && bounded_ && Refine(sol)) {
        if (round + 1 >= o_.max_cut_rounds) {
          result->detail = "cut refinement did not converge";
          return;
        }
        continue;
      }
      result->outcome = IlpOutcome::kOptimal;
      result->bytes = LlmInterNodeBytes(p_, sol);
      result->assignment = std::move(sol);
      return;
    }
  }

 private:
  uint32_t SeqBegin(uint32_t d) const { return p_.docs[d].vl ? sl_.text_sequences() : 0u; }
  uint32_t SeqCount(const LlmDoc& d) const {
    return d.vl ? sl_.vl_sequences() : sl_.text_sequences();
  }
  int Col(uint32_t d, uint32_t r, uint32_t q) const {
    return static_cast<int>(first_col_[d] + r * SeqCount(p_.docs[d]) + (q - SeqBegin(d)));
  }
  void Reset() {
    ind_.assign(1, 0);
    val_.assign(1, 0.0);
  }
  void Push(int col, double v) {
    ind_.push_back(col);
    val_.push_back(v);
  }
  void AddRow(int type, double lo, double hi) {
    glp_prob* g = lp_.get();
    const int row = glp_add_rows(g, 1);
    glp_set_row_bnds(g, row, type, lo, hi);
    glp_set_mat_row(g, row, static_cast<int>(ind_.size()) - 1, ind_.data(), val_.data());
  }
  // Tangent of size*Llm at L: y/scale >= size*(a + 2bL) z/scale - size*b*L^2/scale.
  bool AddCut(uint32_t r, uint32_t mb, uint32_t L) {
    if (!cut_at_.insert({r * M_ + mb, L}).second) return false;
    const double a = p_.cost.llm_linear, b = p_.cost.llm_quadratic;
    const double n = sl_.micro_batch_size(mb);
    Reset();
    Push(z0_ + r * M_ + mb, n * (a + 2 * b * L) / scale_);
    Push(y0_ + r * M_ + mb, -1.0);
    AddRow(GLP_UP, 0.0, n * b * double(L) * L / scale_);
    return true;
  }

  // The LP relaxation (presolved in the first round). False with the
  // outcome or detail set when it has no solution.
  template <typename LeftMs>
  bool SolveRelaxation(uint32_t round, LeftMs left_ms, IlpResult* result) {
    glp_prob* g = lp_.get();
    glp_smcp sp;
    glp_init_smcp(&sp);
    sp.msg_lev = GLP_MSG_OFF;
    sp.presolve = round == 0 ? GLP_ON : GLP_OFF;
    sp.tm_lim = left_ms();
    const int sret = glp_simplex(g, &sp);
    if (sret == GLP_ENOPFS || glp_get_status(g) == GLP_NOFEAS) {
      result->outcome = IlpOutcome::kInfeasible;
      return false;
    }
    if (sret != 0 || glp_get_status(g) != GLP_OPT) {
      // The presolver may leave no basis; solve again without it.
      sp.presolve = GLP_OFF;
      sp.tm_lim = std::max(1, left_ms());
      if (glp_simplex(g, &sp) != 0 || glp_get_status(g) != GLP_OPT) {
        result->detail = absl::StrCat("LP relaxation not solved (glp_simplex ", sret, ")");
        return false;
      }
    }
    return true;
  }

  // Branch and bound from the relaxation, offered the start incumbent.
  template <typename LeftMs>
  bool SolveInteger(LeftMs left_ms, IlpResult* result) {
    glp_prob* g = lp_.get();
    glp_iocp ip;
    glp_init_iocp(&ip);
    ip.msg_lev = GLP_MSG_OFF;
    ip.presolve = GLP_OFF;
    ip.tm_lim = std::max(1, left_ms());
    ip.cb_func = OnSearchEvent;
    ip.cb_info = &search_;
    search_.offered = false;
    const int iret = glp_intopt(g, &ip);
    const int status = glp_mip_status(g);
    if (status == GLP_NOFEAS) {
      result->outcome = IlpOutcome::kInfeasible;
      return false;
    }
    if (iret != 0 || status != GLP_OPT) {
      result->detail = iret == GLP_ETMLIM ? "time limit reached"
                       : search_.out_of_nodes
                           ? absl::StrCat("node limit (", o_.max_nodes, ") reached")
                           : absl::StrCat("glp_intopt returned ", iret);
      return false;
    }
    return true;
  }

  LlmAssignment Solution() const {
    glp_prob* g = lp_.get();
    LlmAssignment sol{std::vector<uint32_t>(D_, 0), std::vector<uint32_t>(D_, 0)};
    for (uint32_t d = 0; d < D_; ++d) {
      for (uint32_t r = 0; r < W_; ++r) {
        for (uint32_t q = SeqBegin(d); q < SeqBegin(d) + SeqCount(p_.docs[d]); ++q) {
          if (glp_mip_col_val(g, Col(d, r, q)) > 0.5) sol.rank[d] = r, sol.seq[d] = q;
        }
      }
    }
    return sol;
  }

  // Padded: a cut at the solution's longest sequence of every micro-batch of
  // a rank whose true cost exceeds the bound. True when a cut was added.
  bool Refine(const LlmAssignment& sol) {
    const auto cost = LlmRankCosts(p_, sol);
    std::vector<uint32_t> fill(size_t{W_} * S_, 0);
    for (uint32_t d = 0; d < D_; ++d)
      fill[size_t{sol.rank[d]} * S_ + sol.seq[d]] += p_.docs[d].tokens;
    bool refined = false;
    for (uint32_t r = 0; r < W_; ++r) {
      if (cost[r] <= bound_ * (1 + 1e-9)) continue;
      for (uint32_t mb = 0; mb < M_; ++mb) {
        uint32_t longest = 0;
        for (uint32_t q = sl_.first_sequence(mb);
             q < sl_.first_sequence(mb) + sl_.micro_batch_size(mb); ++q) {
          longest = std::max(longest, fill[size_t{r} * S_ + q]);
        }
        refined |= AddCut(r, mb, longest);
      }
    }
    return refined;
  }

  const LlmProblem& p_;
  const IlpOptions& o_;
  const SlotLayout& sl_;
  const uint32_t W_, D_, S_, M_;
  const CostModel model_;
  const double bound_;
  const bool bounded_;
  const double scale_;
  GlpProblem lp_;
  std::vector<uint32_t> first_col_;
  int z0_ = 0, y0_ = 0, ncols_ = 0;  // z and y columns: padded only
  std::vector<int> ind_;
  std::vector<double> val_;
  std::set<std::pair<uint32_t, uint32_t>> cut_at_;  // (rank*M + mb, L)
  SearchState search_;
};

}  // namespace

absl::StatusOr<IlpResult> SolveLlmIlp(const LlmProblem& p, const IlpOptions& o) {
  const Clock::time_point t0 = Clock::now();
  IlpModel model(p, o);
  if (const uint64_t binaries = model.Binaries(); binaries > o.max_binaries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ILP reference would need ", binaries, " binary variables, above its limit of ",
        o.max_binaries, "; use it on a smaller instance"));
  }
  model.AddColumns();
  model.AddPlacementRows();
  model.AddCostRows();
  model.SetStart();
  IlpResult result;
  model.Solve(t0, &result);
  result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return result;
}

}  // namespace tutti::dispatch
