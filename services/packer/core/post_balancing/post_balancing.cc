#include "services/packer/core/post_balancing/post_balancing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/cost_model.h"
#include "common/status.h"
#include "services/packer/core/post_balancing/balance.h"
#include "services/packer/core/post_balancing/encoder_phase.h"
#include "services/packer/core/post_balancing/llm_ilp.h"
#include "services/packer/core/post_balancing/llm_phase.h"
#include "services/packer/core/post_balancing/move_lists.h"
#include "services/packer/core/post_balancing/sequence_state.h"

namespace tutti::dispatch {
namespace {

// One encoder's items, flattened in sample order.
struct FlatEncoder {
  EncoderProblem problem;
  std::vector<uint32_t> sample;     // per item
  std::vector<uint32_t> local;      // per item: position in samples[s].items[e]
  std::vector<uint32_t> index;      // per item: its EncoderItem::index
  std::vector<uint64_t> out_bytes;  // per item: encoder output bytes
  std::vector<uint32_t> offset;     // per sample, plus the total
};

FlatEncoder Flatten(const DispatchInput& in, const DispatchOptions& o, EncoderKind kind,
                    const StagingIndex* staging) {
  const CostModel model(o.cost);
  const int e = static_cast<int>(kind);
  FlatEncoder f;
  f.problem.cluster = o.cluster;
  f.problem.availability = in.availability.all() ? nullptr : &in.availability;
  f.problem.staging = in.availability.all() ? nullptr : staging;
  f.offset.reserve(in.samples.size() + 1);
  size_t total = 0;
  for (const Sample& s : in.samples) total += s.items[e].size();
  for (auto* v : {&f.problem.shard, &f.problem.group, &f.sample, &f.local, &f.index}) {
    v->reserve(total);
  }
  f.problem.cost.reserve(total);
  f.out_bytes.reserve(total);
  for (uint32_t s = 0; s < in.samples.size(); ++s) {
    f.offset.push_back(static_cast<uint32_t>(f.sample.size()));
    const auto& items = in.samples[s].items[e];
    for (uint32_t k = 0; k < items.size(); ++k) {
      const EncoderItem& it = items[k];
      f.problem.cost.push_back(kind == EncoderKind::kVision ? model.Vit(it.units)
                                                            : model.Audio(it.units));
      f.problem.shard.push_back(in.samples[s].shard);
      f.problem.group.push_back(s);
      f.sample.push_back(s);
      f.local.push_back(k);
      f.index.push_back(it.index);
      f.out_bytes.push_back(EmbeddingBytes(it.output_tokens, o));
    }
  }
  f.offset.push_back(static_cast<uint32_t>(f.sample.size()));
  return f;
}

LlmProblem MakeLlmProblem(const DispatchInput& in, const DispatchOptions& o) {
  LlmProblem p;
  p.cluster = o.cluster;
  p.slots = o.slots;
  p.cost = o.cost;
  p.padded = o.padded;
  p.docs.reserve(in.samples.size());
  for (const Sample& s : in.samples) p.docs.push_back(LlmDoc{s.llm_tokens, s.vl});
  return p;
}

// Picks, for a remote load, a rank on a node that stages the shard: the drawn
// rank when its node does, else the least-used staging node's least-used rank.
class LoadSources {
 public:
  LoadSources(const DispatchInput& in, const ClusterShape& c)
      : in_(in), c_(c), node_bytes_(c.nodes(), 0), rank_bytes_(c.world_size, 0) {}

  uint32_t Pick(uint32_t shard, uint32_t drawn, uint64_t bytes) {
    uint32_t r = drawn;
    if (!in_.availability.Has(shard, c_.node_of(drawn))) {
      uint32_t node = ~0u;
      for (uint32_t n = 0; n < c_.nodes(); ++n) {
        if (in_.availability.Has(shard, n) && (node == ~0u || node_bytes_[n] < node_bytes_[node])) {
          node = n;
        }
      }
      r = node * c_.ranks_per_node;
      for (uint32_t k = r; k < (node + 1) * c_.ranks_per_node; ++k) {
        if (rank_bytes_[k] < rank_bytes_[r]) r = k;
      }
    }
    node_bytes_[c_.node_of(r)] += bytes;
    rank_bytes_[r] += bytes;
    return r;
  }

 private:
  const DispatchInput& in_;
  ClusterShape c_;
  std::vector<uint64_t> node_bytes_, rank_bytes_;
};

// LLM rank costs of a fixed split, overflow packed into extra sequences.
std::vector<double> SplitLlmCosts(const LlmProblem& p, const std::vector<uint32_t>& split,
                                  uint32_t* overflow) {
  const CostModel model(p.cost);
  SequenceState state(p.cluster, p.slots, model, p.padded);
  std::vector<uint32_t> order(p.docs.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return p.docs[a].tokens > p.docs[b].tokens; });
  std::vector<double> extra(p.cluster.world_size, 0.0);
  // Extra sequences per rank: token fill (one-sequence micro-batches).
  std::vector<std::vector<uint32_t>> extra_fill(p.cluster.world_size);
  *overflow = 0;
  for (uint32_t d : order) {
    const uint32_t r = split[d], t = p.docs[d].tokens;
    uint32_t q;
    double delta;
    if (state.BestSequence(r, t, p.docs[d].vl, &q, &delta)) {
      state.Add(r, q, t, model.Llm(t));
      continue;
    }
    auto& fills = extra_fill[r];
    auto it = std::find_if(fills.begin(), fills.end(),
                           [&](uint32_t f) { return f + t <= p.slots.seq_len; });
    if (it == fills.end()) {
      fills.push_back(0);
      it = fills.end() - 1;
      ++*overflow;
    }
    *it += t;
    if (!p.padded) extra[r] += model.Llm(t);
  }
  std::vector<double> cost = state.costs();
  for (uint32_t r = 0; r < cost.size(); ++r) {
    cost[r] += extra[r];
    if (p.padded) {
      for (uint32_t f : extra_fill[r]) cost[r] += model.Llm(f);
    }
  }
  return cost;
}

}  // namespace

PhaseStats MakePhaseStats(const char* phase, const std::vector<double>& rank_cost,
                          double lower_bound) {
  PhaseStats s;
  s.phase = phase;
  double total = 0;
  for (double c : rank_cost) {
    total += c;
    s.max = std::max(s.max, c);
  }
  s.mean = rank_cost.empty() ? 0 : total / rank_cost.size();
  s.lower_bound = std::max(lower_bound, s.mean);
  s.imbalance = s.mean > 0 ? s.max / s.mean : 1.0;
  s.imbalance_vs_bound = s.lower_bound > 0 ? s.max / s.lower_bound : 1.0;
  return s;
}

absl::Status ValidateDispatchInput(const DispatchInput& in, const DispatchOptions& o) {
  const ClusterShape& c = o.cluster;
  const SlotLayout& sl = o.slots;
  if (c.world_size == 0 || c.ranks_per_node == 0 || c.world_size % c.ranks_per_node != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size ", c.world_size, " must be a positive multiple of ranks_per_node ",
                     c.ranks_per_node, "; every node runs the same number of ranks"));
  }
  if (sl.seq_len == 0 || sl.sequences() == 0 ||
      (sl.text_micro_batches > 0 && sl.text_micro_batch == 0) ||
      (sl.vl_micro_batches > 0 && sl.vl_micro_batch == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the sequence layout (seq_len ", sl.seq_len, ", ", sl.text_micro_batches, " x ",
        sl.text_micro_batch, " text, ", sl.vl_micro_batches, " x ", sl.vl_micro_batch,
        " VL sequences) has no room; every rank needs at least one sequence of a positive "
        "seq_len"));
  }
  if (o.hidden_size == 0 || o.embedding_dtype_bytes == 0 || o.token_id_bytes == 0) {
    return absl::InvalidArgumentError(
        "hidden_size, embedding_dtype_bytes and token_id_bytes must be positive");
  }
  if (!(o.balance_tolerance >= 0) || !std::isfinite(o.balance_tolerance)) {
    return absl::InvalidArgumentError(absl::StrCat("balance_tolerance ", o.balance_tolerance,
                                                   " must be a finite number >= 0, e.g. 0.01"));
  }
  const ShardAvailability& av = in.availability;
  std::vector<uint8_t> staged_somewhere;
  if (!av.all()) {
    if (av.nodes() != c.nodes()) {
      return absl::InvalidArgumentError(absl::StrCat("the shard availability bitmap has ",
                                                     av.nodes(), " nodes but the job has ",
                                                     c.nodes(), "; build it for every node"));
    }
    staged_somewhere.assign(av.shards(), 0);
    for (uint32_t s = 0; s < av.shards(); ++s) {
      for (uint32_t n = 0; n < av.nodes() && !staged_somewhere[s]; ++n) {
        staged_somewhere[s] = av.Has(s, n);
      }
    }
  }
  // Duplicate ids: a bitmap when ids are dense (the usual case), else a set.
  uint64_t max_id = 0;
  for (const Sample& s : in.samples) max_id = std::max(max_id, s.sample_id);
  const bool dense = max_id < 8 * uint64_t{in.samples.size()} + 64;
  std::vector<uint64_t> seen_bits(dense ? max_id / 64 + 1 : 0, 0);
  absl::flat_hash_set<uint64_t> ids;
  if (!dense) ids.reserve(in.samples.size());
  auto first_time = [&](uint64_t id) {
    if (!dense) return ids.insert(id).second;
    uint64_t& word = seen_bits[id / 64];
    const uint64_t bit = uint64_t{1} << (id % 64);
    if (word & bit) return false;
    word |= bit;
    return true;
  };
  uint64_t tokens[2] = {0, 0};
  for (const Sample& s : in.samples) {
    auto who = [&s] { return absl::StrCat("sample ", s.sample_id); };
    if (!first_time(s.sample_id)) {
      return absl::InvalidArgumentError(absl::StrCat(who(), " appears twice in the step"));
    }
    if (s.drawn_rank >= c.world_size) {
      return absl::InvalidArgumentError(absl::StrCat(who(), " was drawn by rank ", s.drawn_rank,
                                                     ", outside world_size ", c.world_size));
    }
    if (s.llm_tokens == 0 || s.llm_tokens > sl.seq_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          who(), " has ", s.llm_tokens, " LLM tokens; a document needs 1 to seq_len (", sl.seq_len,
          ") tokens: drop or truncate it when sampling, or raise seq_len"));
    }
    uint64_t encoder_tokens = 0;
    size_t items = 0;
    for (int e = 0; e < kNumEncoders; ++e) {
      items += s.items[e].size();
      for (const EncoderItem& it : s.items[e]) {
        if (it.units == 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              who(), " has an empty ", EncoderPhaseName(kEncoders[e]), " item (index ", it.index,
              "): every image or audio clip needs at least one patch or token"));
        }
        encoder_tokens += it.output_tokens;
      }
    }
    if (s.vl != (items > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          who(),
          s.vl ? " is VL but has no images or audio" : " is text-only but has images or audio",
          "; its modality must match its members"));
    }
    if (encoder_tokens > s.llm_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat(who(), " has ", encoder_tokens, " encoder tokens but only ", s.llm_tokens,
                       " LLM tokens; llm_tokens must include every encoder token"));
    }
    if (!av.all()) {
      if (s.shard >= av.shards()) {
        return absl::InvalidArgumentError(absl::StrCat(who(), " is in shard ", s.shard,
                                                       ", outside the availability bitmap of ",
                                                       av.shards(), " shards"));
      }
      if (!staged_somewhere[s.shard]) {
        return absl::FailedPreconditionError(
            absl::StrCat(who(), " is in shard ", s.shard,
                         ", which no node's stager has staged; stage it first"));
      }
    }
    tokens[s.vl] += s.llm_tokens;
  }
  const uint64_t room[2] = {uint64_t{c.world_size} * sl.text_sequences() * sl.seq_len,
                            uint64_t{c.world_size} * sl.vl_sequences() * sl.seq_len};
  for (int m = 0; m < 2; ++m) {
    if (tokens[m] > room[m]) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the step holds ", tokens[m], (m ? " VL" : " text"), " tokens but only ",
                       room[m], " fit its ", (m ? "VL" : "text"), " sequences (", c.world_size,
                       " ranks x ", (m ? sl.vl_sequences() : sl.text_sequences()), " x ",
                       sl.seq_len, "); draw fewer samples per step or add sequences"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SplitEvaluation> EvaluateSplit(const DispatchInput& in, const DispatchOptions& o,
                                              const std::vector<uint32_t>& split) {
  if (split.size() != in.samples.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("split covers ", split.size(), " samples, the step has ", in.samples.size()));
  }
  for (uint32_t r : split) {
    if (r >= o.cluster.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("split names rank ", r, ", outside world_size ", o.cluster.world_size));
    }
  }
  SplitEvaluation out;
  for (EncoderKind kind : kEncoders) {
    const FlatEncoder f = Flatten(in, o, kind, nullptr);
    if (f.sample.empty()) continue;
    std::vector<double> cost(o.cluster.world_size, 0.0);
    for (size_t i = 0; i < f.sample.size(); ++i) cost[split[f.sample[i]]] += f.problem.cost[i];
    out.phases.push_back(MakePhaseStats(EncoderPhaseName(kind), cost,
                                        MakespanLowerBound(f.problem.cost, o.cluster.world_size)));
  }
  const LlmProblem p = MakeLlmProblem(in, o);
  const auto cost = SplitLlmCosts(p, split, &out.overflow_sequences);
  out.phases.push_back(MakePhaseStats("llm", cost, LlmLowerBound(p)));
  return out;
}

namespace {

// Encoder phases and the LLM rearrangement problem (shared by Dispatch and
// BuildRearrangement).
absl::StatusOr<RearrangementInstance> Stage(const DispatchInput& in, const DispatchOptions& o,
                                            const StagingIndex& staging,
                                            std::array<FlatEncoder, kNumEncoders>* flat,
                                            LlmAssignment* balanced) {
  const ClusterShape& c = o.cluster;
  const uint32_t W = c.world_size;
  const size_t n = in.samples.size();
  RearrangementInstance inst;
  for (EncoderKind kind : kEncoders) {
    const int e = static_cast<int>(kind);
    (*flat)[e] = Flatten(in, o, kind, &staging);
    const EncoderProblem& prob = (*flat)[e].problem;
    inst.encoder_lower_bound[e] = MakespanLowerBound(prob.cost, W);
    EncoderPlacement placed =
        PlaceEncoder(prob, o.node_aware, o.balance_tolerance, o.kk_max_ranks, o.improvement_rounds);
    inst.encoder_bound[e] = placed.bound;
    inst.encoder_rank[e] = std::move(placed.rank);
  }
  LlmProblem& llm = inst.problem;
  llm = MakeLlmProblem(in, o);
  inst.llm_lower_bound = LlmLowerBound(llm);
  llm.bound = (1 + o.balance_tolerance) * inst.llm_lower_bound;
  if (!o.node_aware) {
    ASSIGN_OR_RETURN(*balanced, BalanceLlm(llm, o.improvement_rounds));
    const auto cost = LlmRankCosts(llm, *balanced);
    llm.bound = std::max(llm.bound, *std::max_element(cost.begin(), cost.end()));
    return inst;
  }
  // Bytes that cross nodes per node the sample's LLM rank may be on.
  const bool restricted = !in.availability.all();
  std::vector<NodeAffinity::Entry> entries;
  for (uint32_t s = 0; s < n; ++s) {
    entries.clear();
    uint64_t base = 0;
    for (int e = 0; e < kNumEncoders; ++e) {
      const FlatEncoder& f = (*flat)[e];
      for (uint32_t i = f.offset[s]; i < f.offset[s + 1]; ++i) {
        base += f.out_bytes[i];
        entries.push_back({c.node_of(inst.encoder_rank[e][i]), f.out_bytes[i]});
      }
    }
    if (restricted) {
      const uint64_t text = uint64_t{in.samples[s].text_tokens} * o.token_id_bytes;
      const uint32_t shard = in.samples[s].shard;
      if (!staging.everywhere(shard) && text > 0) {
        base += text;
        for (const uint32_t* nd = staging.begin(shard); nd != staging.end(shard); ++nd) {
          entries.push_back({*nd, text});
        }
      }
    }
    llm.affinity.AddDoc(base, &entries);
  }
  return inst;
}

}  // namespace

absl::StatusOr<RearrangementInstance> BuildRearrangement(const DispatchInput& in,
                                                         const DispatchOptions& o) {
  RETURN_IF_ERROR(ValidateDispatchInput(in, o));
  std::array<FlatEncoder, kNumEncoders> flat;
  LlmAssignment unused;
  const StagingIndex staging(in.availability);
  return Stage(in, o, staging, &flat, &unused);
}

namespace {

// The node-aware LLM placement: the fast rearrangement, or (kIlp) GLPK's
// optimum started from it when GLPK proves one within its budgets.
absl::StatusOr<LlmAssignment> Rearrange(const DispatchOptions& o, LlmProblem* llm,
                                        DispatchStats* stats) {
  ASSIGN_OR_RETURN(RearrangeResult rr,
                   RearrangeLlm(*llm, o.improvement_rounds, o.balance_tolerance));
  stats->llm_fallback = rr.fell_back;
  llm->bound = rr.bound;
  stats->rearrangement = "fast";
  if (o.rearrangement != Rearrangement::kIlp) return std::move(rr.assignment);
  IlpOptions io;
  io.start = &rr.assignment;
  io.max_nodes = o.ilp_max_nodes;
  io.time_limit_s = o.ilp_time_limit_s;
  absl::StatusOr<IlpResult> ilp = SolveLlmIlp(*llm, io);
  if (!ilp.ok()) {
    stats->rearrangement = absl::StrCat("ilp: ", ilp.status().message(), "; fast kept");
  } else if (ilp->outcome == IlpOutcome::kOptimal &&
             ilp->bytes <= LlmInterNodeBytes(*llm, rr.assignment)) {
    stats->rearrangement = "ilp optimal";
    return std::move(ilp->assignment);
  } else {
    stats->rearrangement =
        absl::StrCat("ilp: ", ilp->outcome == IlpOutcome::kInfeasible ? "infeasible" : ilp->detail,
                     "; fast kept");
  }
  return std::move(rr.assignment);
}

}  // namespace

absl::StatusOr<DispatchPlan> Dispatch(const DispatchInput& in, const DispatchOptions& o) {
  RETURN_IF_ERROR(ValidateDispatchInput(in, o));
  const ClusterShape& c = o.cluster;
  const uint32_t W = c.world_size;
  const uint32_t n = static_cast<uint32_t>(in.samples.size());
  const bool restricted = !in.availability.all();
  DispatchPlan plan;
  plan.cluster = c;
  plan.slots = o.slots;
  std::array<FlatEncoder, kNumEncoders> flat;
  LlmAssignment balanced;
  const StagingIndex staging(in.availability);
  ASSIGN_OR_RETURN(RearrangementInstance inst, Stage(in, o, staging, &flat, &balanced));
  const auto& enc_bound = inst.encoder_bound;
  const auto& enc_lb = inst.encoder_lower_bound;
  const double llm_lb = inst.llm_lower_bound;
  LlmProblem& llm = inst.problem;
  for (int e = 0; e < kNumEncoders; ++e) {
    plan.item_offset[e] = flat[e].offset;
    plan.encoders[e].kind = kEncoders[e];
    plan.encoders[e].rank = std::move(inst.encoder_rank[e]);
  }
  std::vector<uint32_t> node(W);  // node of every rank (no division in the loops below)
  for (uint32_t r = 0; r < W; ++r) node[r] = c.node_of(r);
  LlmAssignment assignment;
  if (o.node_aware) {
    ASSIGN_OR_RETURN(assignment, Rearrange(o, &llm, &plan.stats));
    // Pull encoder items onto their sample's LLM node where balance allows.
    for (int e = 0; e < kNumEncoders; ++e) {
      const FlatEncoder& f = flat[e];
      if (f.sample.empty()) continue;
      std::vector<uint32_t> preferred(f.sample.size());
      for (size_t i = 0; i < f.sample.size(); ++i)
        preferred[i] = node[assignment.rank[f.sample[i]]];
      const std::vector<uint8_t> touched =
          MoveTowardNodes(f.problem, preferred, f.out_bytes, enc_bound[e], &plan.encoders[e].rank);
      ImproveWithinNodes(f.problem, o.improvement_rounds, &plan.encoders[e].rank, &touched);
    }
  } else {
    assignment = std::move(balanced);
  }
  plan.llm_rank = assignment.rank;
  plan.llm_seq = assignment.seq;

  // LLM layout: per rank, micro-batches of sequences, docs by sample index.
  const SlotLayout& sl = o.slots;
  // Docs per (rank, sequence) slot, by a counting sort: slot_start[k] is
  // where slot k's docs begin in slot_docs.
  const size_t slots = size_t{W} * sl.sequences();
  std::vector<uint32_t> slot_start(slots + 1, 0), slot_docs(n);
  for (uint32_t s = 0; s < n; ++s) {
    ++slot_start[size_t{assignment.rank[s]} * sl.sequences() + assignment.seq[s] + 1];
  }
  for (size_t k = 0; k < slots; ++k) slot_start[k + 1] += slot_start[k];
  {
    std::vector<uint32_t> fill(slot_start.begin(), slot_start.end() - 1);
    for (uint32_t s = 0; s < n; ++s) {
      slot_docs[fill[size_t{assignment.rank[s]} * sl.sequences() + assignment.seq[s]]++] = s;
    }
  }
  const auto llm_cost = LlmRankCosts(llm, assignment);
  plan.llm.resize(W);
  for (uint32_t r = 0; r < W; ++r) {
    RankLlmPlan& rp = plan.llm[r];
    rp.cost = llm_cost[r];
    rp.micro_batches.resize(sl.micro_batches());
    for (uint32_t mb = 0; mb < sl.micro_batches(); ++mb) {
      MicroBatchPlan& m = rp.micro_batches[mb];
      m.vl = mb >= sl.text_micro_batches;
      m.sequences.resize(sl.micro_batch_size(mb));
      for (uint32_t j = 0; j < sl.micro_batch_size(mb); ++j) {
        SequencePlan& sp = m.sequences[j];
        const size_t k = size_t{r} * sl.sequences() + sl.first_sequence(mb) + j;
        sp.docs.assign(slot_docs.begin() + slot_start[k], slot_docs.begin() + slot_start[k + 1]);
        for (uint32_t s : sp.docs) sp.tokens += llm.docs[s].tokens;
      }
    }
  }

  // Encoder lists per rank in (LLM rank, LLM order, item) order; remote loads.
  LoadSources sources(in, c);
  std::vector<Move> load_moves;
  for (int e = 0; e < kNumEncoders; ++e) {
    const FlatEncoder& f = flat[e];
    EncoderPhasePlan& ep = plan.encoders[e];
    const size_t items = f.sample.size();
    // By (encoder rank, LLM rank, LLM position, position in the sample): the
    // items of the samples in LLM order (slot_docs), then a stable counting
    // sort by encoder rank.
    std::vector<uint32_t> by_llm;
    by_llm.reserve(items);
    for (uint32_t s : slot_docs) {
      for (uint32_t i = f.offset[s]; i < f.offset[s + 1]; ++i) by_llm.push_back(i);
    }
    std::vector<uint32_t> start(W + 1, 0), order(items);
    for (uint32_t i : by_llm) ++start[ep.rank[i] + 1];
    for (uint32_t r = 0; r < W; ++r) start[r + 1] += start[r];
    {
      std::vector<uint32_t> at(start.begin(), start.end() - 1);
      for (uint32_t i : by_llm) order[at[ep.rank[i]]++] = i;
    }
    ep.rank_items.assign(W, {});
    for (uint32_t r = 0; r < W; ++r) ep.rank_items[r].reserve(start[r + 1] - start[r]);
    ep.rank_cost.assign(W, 0.0);
    ep.remote_load.assign(items, 0);
    ep.load_source.assign(items, 0);
    for (uint32_t i : order) {
      const uint32_t r = ep.rank[i], s = f.sample[i];
      ep.rank_items[r].push_back(ItemRef{s, f.local[i]});
      ep.rank_cost[r] += f.problem.cost[i];
      ep.load_source[i] = r;
      if (restricted && !in.availability.Has(f.problem.shard[i], node[r])) {
        const uint64_t bytes = in.samples[s].items[e][f.local[i]].input_bytes;
        ep.remote_load[i] = 1;
        ep.load_source[i] = sources.Pick(f.problem.shard[i], in.samples[s].drawn_rank, bytes);
        load_moves.push_back(
            Move{ep.load_source[i], r,
                 ExchangeItem{s, ep.kind, Payload::kEncoderInput, f.index[i], bytes}});
        ++plan.stats.remote_load_items;
      }
    }
  }
  plan.text_remote.assign(n, 0);
  plan.text_source = assignment.rank;
  if (restricted) {  // in LLM order, so that sources are picked deterministically
    for (uint32_t r = 0; r < W; ++r) {
      for (size_t k = size_t{r} * sl.sequences(); k < size_t{r + 1} * sl.sequences(); ++k) {
        for (uint32_t j = slot_start[k]; j < slot_start[k + 1]; ++j) {
          const uint32_t s = slot_docs[j];
          if (in.availability.Has(in.samples[s].shard, node[r])) continue;
          const uint64_t bytes = uint64_t{in.samples[s].text_tokens} * o.token_id_bytes;
          plan.text_remote[s] = 1;
          plan.text_source[s] = sources.Pick(in.samples[s].shard, in.samples[s].drawn_rank, bytes);
          load_moves.push_back(
              Move{plan.text_source[s], r,
                   ExchangeItem{s, EncoderKind::kVision, Payload::kTextTokens, 0, bytes}});
          ++plan.stats.remote_text_samples;
        }
      }
    }
  }

  // The composed forward exchange: encoder rank -> LLM rank, in one step.
  // Its byte totals come straight from the placement.
  for (int e = 0; e < kNumEncoders; ++e) {
    const FlatEncoder& f = flat[e];
    for (size_t i = 0; i < f.sample.size(); ++i) {
      const uint32_t src = plan.encoders[e].rank[i], dst = assignment.rank[f.sample[i]];
      (src == dst               ? plan.stats.self_bytes
       : node[src] == node[dst] ? plan.stats.intra_node_bytes
                                : plan.stats.inter_node_bytes) += f.out_bytes[i];
    }
  }
  for (const Move& m : load_moves) plan.stats.remote_load_bytes += m.item.bytes;
  if (o.build_exchanges) {
    std::vector<Move> moves;
    size_t total = 0;
    for (int e = 0; e < kNumEncoders; ++e) total += flat[e].sample.size();
    moves.reserve(total);
    for (uint32_t r = 0; r < W; ++r) {
      for (int e = 0; e < kNumEncoders; ++e) {
        const FlatEncoder& f = flat[e];
        for (const ItemRef& ref : plan.encoders[e].rank_items[r]) {
          const uint32_t i = f.offset[ref.sample] + ref.item;
          moves.push_back(Move{r, assignment.rank[ref.sample],
                               ExchangeItem{ref.sample, kEncoders[e], Payload::kEncoderOutput,
                                            f.index[i], f.out_bytes[i]}});
        }
      }
    }
    plan.forward = BuildExchange(c, moves);
    plan.load = BuildExchange(c, load_moves);
  }

  // Statistics, with the drawn split as "before" (unpadded LLM cost needs
  // no packing: it is the sum of the documents' costs).
  std::vector<PhaseStats> before;
  for (int e = 0; e < kNumEncoders; ++e) {
    if (flat[e].sample.empty()) continue;
    std::vector<double> cost(W, 0.0);
    for (size_t i = 0; i < flat[e].sample.size(); ++i) {
      cost[in.samples[flat[e].sample[i]].drawn_rank] += flat[e].problem.cost[i];
    }
    before.push_back(MakePhaseStats(EncoderPhaseName(kEncoders[e]), cost, 0));
  }
  {
    std::vector<double> cost(W, 0.0);
    if (o.padded) {
      std::vector<uint32_t> drawn(n);
      for (uint32_t s = 0; s < n; ++s) drawn[s] = in.samples[s].drawn_rank;
      uint32_t overflow = 0;
      cost = SplitLlmCosts(llm, drawn, &overflow);
    } else {
      const CostModel model(o.cost);
      for (uint32_t s = 0; s < n; ++s)
        cost[in.samples[s].drawn_rank] += model.Llm(llm.docs[s].tokens);
    }
    before.push_back(MakePhaseStats("llm", cost, 0));
  }
  auto add_phase = [&](PhaseStats st, double bound) {
    st.bound = bound;
    for (const PhaseStats& b : before) {
      if (b.phase == st.phase) st.imbalance_before = b.imbalance;
    }
    plan.stats.phases.push_back(std::move(st));
  };
  for (int e = 0; e < kNumEncoders; ++e) {
    if (flat[e].sample.empty()) continue;
    add_phase(MakePhaseStats(EncoderPhaseName(kEncoders[e]), plan.encoders[e].rank_cost, enc_lb[e]),
              enc_bound[e]);
  }
  add_phase(MakePhaseStats("llm", llm_cost, llm_lb), llm.bound);
  return plan;
}

}  // namespace tutti::dispatch
