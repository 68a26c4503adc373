#include "services/packer/core/post_balancing/post_balancing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/cost_model.h"
#include "common/status.h"
#include "services/packer/core/post_balancing/balance.h"
#include "services/packer/core/post_balancing/encoder_phase.h"
#include "services/packer/core/post_balancing/llm_ilp.h"
#include "services/packer/core/post_balancing/llm_phase.h"
#include "services/packer/core/post_balancing/sequence_state.h"

namespace tutti::dispatch {
namespace {

// One encoder's items in batch order (the step's images or audio clips,
// which are sorted by their sample).
struct FlatEncoder {
  EncoderProblem problem;
  std::vector<uint32_t> sample;     // per item: its sample (index into step.samples)
  std::vector<uint64_t> out_bytes;  // per item: encoder output bytes
  std::vector<uint64_t> in_bytes;   // per item: input bytes (a remote load carries them)
  std::vector<uint32_t> offset;     // per sample, plus the total
};

FlatEncoder Flatten(const StepPlanData& step, const ShardAvailability& availability,
                    const DispatchOptions& o, EncoderKind kind, const StagingIndex* staging) {
  FlatEncoder f;
  f.problem.cluster = o.cluster;
  f.problem.availability = availability.all() ? nullptr : &availability;
  f.problem.staging = availability.all() ? nullptr : staging;
  const bool vision = kind == EncoderKind::kVision;
  const size_t total = vision ? step.images.size() : step.audio.size();
  for (auto* v : {&f.problem.shard, &f.problem.group, &f.sample}) v->reserve(total);
  f.problem.cost.reserve(total);
  f.out_bytes.reserve(total);
  f.in_bytes.reserve(total);
  for (size_t i = 0; i < total; ++i) {
    const uint32_t owner = vision ? step.images[i].owner : step.audio[i].owner;
    f.problem.cost.push_back(vision ? step.images[i].cost : step.audio[i].cost);
    f.problem.shard.push_back(step.samples[owner].shard);
    f.problem.group.push_back(owner);
    f.sample.push_back(owner);
    f.out_bytes.push_back(vision ? step.images[i].output_bytes : step.audio[i].output_bytes);
    f.in_bytes.push_back(vision ? step.images[i].input_bytes : step.audio[i].input_bytes);
  }
  f.offset.assign(step.samples.size() + 1, 0);
  for (uint32_t s : f.sample) ++f.offset[s + 1];
  for (size_t s = 0; s < step.samples.size(); ++s) f.offset[s + 1] += f.offset[s];
  return f;
}

LlmProblem MakeLlmProblem(const StepPlanData& step, const DispatchOptions& o) {
  LlmProblem p;
  p.cluster = o.cluster;
  p.slots = o.slots;
  p.cost = o.cost;
  p.padded = o.padded;
  p.docs.reserve(step.samples.size());
  for (const packer::PlannedSample& s : step.samples) {
    p.docs.push_back(LlmDoc{s.cost.llm_tokens, s.vl, s.cost.image_tokens});
  }
  return p;
}

// Picks, for a remote load, a rank on a node that stages the shard: the drawn
// rank when its node does, else the least-used staging node's least-used rank
// (the shard's staging nodes from `staging`, increasing, lowest on ties).
class LoadSources {
 public:
  LoadSources(const ShardAvailability& availability, const StagingIndex& staging,
              const ClusterShape& c)
      : availability_(availability),
        staging_(staging),
        c_(c),
        node_bytes_(c.nodes(), 0),
        rank_bytes_(c.world_size, 0) {}

  uint32_t Pick(uint32_t shard, uint32_t drawn, uint64_t bytes) {
    uint32_t r = drawn;
    if (!availability_.Has(shard, c_.node_of(drawn))) {
      uint32_t node = ~0u;
      for (const uint32_t* n = staging_.begin(shard); n != staging_.end(shard); ++n) {
        if (node == ~0u || node_bytes_[*n] < node_bytes_[node]) node = *n;
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
  const ShardAvailability& availability_;
  const StagingIndex& staging_;
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
    if (state.BestSequence(r, t, p.docs[d].vl, &q, &delta, p.docs[d].image_tokens)) {
      state.Add(r, q, t, model.Llm(t), p.docs[d].image_tokens);
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

PhaseSummary MakePhaseSummary(const std::vector<double>& rank_cost, double lower_bound) {
  PhaseSummary s;
  double total = 0;
  for (double c : rank_cost) {
    total += c;
    s.max = std::max(s.max, c);
  }
  s.mean = rank_cost.empty() ? 0 : total / rank_cost.size();
  s.lower_bound = std::max(lower_bound, s.mean);
  s.imbalance = s.mean > 0 ? s.max / s.mean : 1.0;
  return s;
}

absl::Status ValidateStep(const StepPlanData& step, const ShardAvailability& av,
                          const DispatchOptions& o) {
  const ClusterShape& c = o.cluster;
  SlotLayout sl = o.slots;
  sl.seq_len = step.seq_len;
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
  std::vector<uint8_t> staged_somewhere;
  if (!av.all()) {
    if (av.nodes() != c.nodes()) {
      return absl::InvalidArgumentError(absl::StrCat("the shard availability bitmap has ",
                                                     av.nodes(), " nodes but the job has ",
                                                     c.nodes(), "; build it for every node"));
    }
    staged_somewhere.assign(av.shards(), 0);
    for (uint32_t s = 0; s < av.shards(); ++s) staged_somewhere[s] = av.AnyNode(s);
  }
  // Encoder tokens and items per sample.
  const uint32_t n = static_cast<uint32_t>(step.samples.size());
  std::vector<uint64_t> encoder_tokens(n, 0);
  std::vector<uint32_t> items(n, 0);
  for (const packer::PlannedImage& im : step.images) {
    if (im.owner >= n) return absl::InvalidArgumentError("an image names no sample of the step");
    if (im.patches == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample ", step.samples[im.owner].sample, " has an empty vit item (index ",
          im.image_index, "): every image or audio clip needs at least one patch or token"));
    }
    encoder_tokens[im.owner] += im.llm_tokens;
    ++items[im.owner];
  }
  for (const packer::PlannedAudio& au : step.audio) {
    if (au.owner >= n) return absl::InvalidArgumentError("a clip names no sample of the step");
    if (au.tokens == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample ", step.samples[au.owner].sample, " has an empty audio item (index ",
          au.audio_index, "): every image or audio clip needs at least one patch or token"));
    }
    encoder_tokens[au.owner] += au.tokens;
    ++items[au.owner];
  }
  uint64_t tokens[2] = {0, 0};
  for (uint32_t k = 0; k < n; ++k) {
    const packer::PlannedSample& s = step.samples[k];
    auto who = [&s] { return absl::StrCat("sample ", s.sample); };
    if (s.drawn_rank >= c.world_size) {
      return absl::InvalidArgumentError(absl::StrCat(who(), " was drawn by rank ", s.drawn_rank,
                                                     ", outside world_size ", c.world_size));
    }
    const uint32_t llm_tokens = s.cost.llm_tokens;
    if (llm_tokens == 0 || llm_tokens > sl.seq_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          who(), " has ", llm_tokens, " LLM tokens; a document needs 1 to seq_len (", sl.seq_len,
          ") tokens: drop or truncate it when sampling, or raise seq_len"));
    }
    // A piece of a split VL document may hold text alone (its images went
    // to other pieces); it still belongs in the VL sequences.
    const bool vl_text_piece = s.vl && s.pieces > 1;
    if (s.vl != (items[k] > 0) && !vl_text_piece) {
      return absl::InvalidArgumentError(absl::StrCat(
          who(),
          s.vl ? " is VL but has no images or audio" : " is text-only but has images or audio",
          "; its modality must match its members"));
    }
    if (encoder_tokens[k] > llm_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat(who(), " has ", encoder_tokens[k], " encoder tokens but only ", llm_tokens,
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
    tokens[s.vl] += llm_tokens;
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

namespace {

// The balance tolerance the node-aware greedy passes seek locality within
// (dispatch_types.h): each phase is lowered to balance_tolerance after.
double WorkingTolerance(const DispatchOptions& o) {
  return o.node_aware ? std::max(o.balance_tolerance, o.locality_slack) : o.balance_tolerance;
}

// Encoder phases and the LLM rearrangement problem (shared by Dispatch and
// BuildRearrangement).
absl::StatusOr<RearrangementInstance> Stage(const StepPlanData& step,
                                            const ShardAvailability& availability,
                                            const DispatchOptions& o, const StagingIndex& staging,
                                            std::array<FlatEncoder, kNumEncoders>* flat,
                                            LlmAssignment* balanced) {
  const ClusterShape& c = o.cluster;
  const uint32_t W = c.world_size;
  const size_t n = step.samples.size();
  const double work = WorkingTolerance(o);
  RearrangementInstance inst;
  for (EncoderKind kind : kEncoders) {
    const int e = static_cast<int>(kind);
    (*flat)[e] = Flatten(step, availability, o, kind, &staging);
    const EncoderProblem& prob = (*flat)[e].problem;
    inst.encoder_lower_bound[e] = MakespanLowerBound(prob.cost, W);
    EncoderPlacement placed =
        PlaceEncoder(prob, o.node_aware, work, o.kk_max_ranks, o.improvement_rounds);
    inst.encoder_bound[e] = placed.bound;
    inst.encoder_rank[e] = std::move(placed.rank);
  }
  LlmProblem& llm = inst.problem;
  llm = MakeLlmProblem(step, o);
  inst.llm_lower_bound = LlmLowerBound(llm);
  llm.bound = (1 + work) * inst.llm_lower_bound;
  if (!o.node_aware) {
    ASSIGN_OR_RETURN(*balanced, BalanceLlm(llm, o.improvement_rounds));
    const auto cost = LlmRankCosts(llm, *balanced);
    llm.bound = std::max(llm.bound, *std::max_element(cost.begin(), cost.end()));
    return inst;
  }
  // Bytes that cross nodes per node the sample's LLM rank may be on.
  const bool restricted = !availability.all();
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
    if (restricted && o.text_affinity) {
      const uint64_t text = uint64_t{step.samples[s].cost.text_tokens} * o.token_id_bytes;
      const uint32_t shard = step.samples[s].shard;
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

// seq_len comes from the step.
DispatchOptions WithSeqLen(const StepPlanData& step, const DispatchOptions& o) {
  DispatchOptions out = o;
  out.slots.seq_len = step.seq_len;
  return out;
}

absl::StatusOr<RearrangementInstance> BuildRearrangement(const StepPlanData& step,
                                                         const ShardAvailability& availability,
                                                         const DispatchOptions& options) {
  const DispatchOptions o = WithSeqLen(step, options);
  RETURN_IF_ERROR(ValidateStep(step, availability, o));
  std::array<FlatEncoder, kNumEncoders> flat;
  LlmAssignment unused;
  const StagingIndex staging(availability);
  return Stage(step, availability, o, staging, &flat, &unused);
}

namespace {

// The node-aware LLM placement: the fast rearrangement, or (kIlp) GLPK's
// optimum started from it when GLPK proves one within its budgets.
struct RearrangeStats {
  bool llm_fallback = false;
  std::string rearrangement = "fast";
};

absl::StatusOr<LlmAssignment> Rearrange(const DispatchOptions& o, double target, LlmProblem* llm,
                                        RearrangeStats* stats) {
  ASSIGN_OR_RETURN(RearrangeResult rr,
                   RearrangeLlm(*llm, o.improvement_rounds, WorkingTolerance(o), nullptr, target));
  stats->llm_fallback = rr.fell_back;
  llm->bound = rr.bound;
  if (target > 0) {
    // Balance bought back below the bound is kept: an exact rearrangement
    // must not give it away.
    const std::vector<double> cost = LlmRankCosts(*llm, rr.assignment);
    llm->bound =
        std::min(llm->bound, std::max(target, *std::max_element(cost.begin(), cost.end())));
  }
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

namespace {

// Samples in LLM order, by (rank, sequence) slot and batch order within a
// slot (a counting sort): slot k's samples are order[start[k], start[k+1]).
void LlmOrder(const LlmAssignment& a, uint32_t W, uint32_t S, std::vector<uint32_t>* start,
              std::vector<uint32_t>* order) {
  const uint32_t n = static_cast<uint32_t>(a.rank.size());
  const size_t slots = size_t{W} * S;
  start->assign(slots + 1, 0);
  order->resize(n);
  for (uint32_t s = 0; s < n; ++s) ++(*start)[size_t{a.rank[s]} * S + a.seq[s] + 1];
  for (size_t k = 0; k < slots; ++k) (*start)[k + 1] += (*start)[k];
  std::vector<uint32_t> fill(start->begin(), start->end() - 1);
  for (uint32_t s = 0; s < n; ++s) (*order)[fill[size_t{a.rank[s]} * S + a.seq[s]]++] = s;
}

// One encoder's placement written to the step: encoder ranks, per-rank cost
// and, where the encoder rank's node does not stage the shard, the remote
// load and its source. Items are visited by (encoder rank, LLM order), so
// that per-rank sums and load sources do not depend on anything else.
std::vector<double> PlaceEncoderItems(EncoderKind kind, const FlatEncoder& f,
                                      const std::vector<uint32_t>& rank,
                                      const std::vector<uint32_t>& llm_order,
                                      const ShardAvailability& availability,
                                      const std::vector<uint32_t>& node, LoadSources* sources,
                                      StepPlanData* step) {
  const uint32_t W = static_cast<uint32_t>(node.size());
  const size_t items = f.sample.size();
  std::vector<uint32_t> by_llm;
  by_llm.reserve(items);
  for (uint32_t s : llm_order) {
    for (uint32_t i = f.offset[s]; i < f.offset[s + 1]; ++i) by_llm.push_back(i);
  }
  std::vector<uint32_t> start(W + 1, 0), order(items);
  for (uint32_t i : by_llm) ++start[rank[i] + 1];
  for (uint32_t r = 0; r < W; ++r) start[r + 1] += start[r];
  {
    std::vector<uint32_t> at(start.begin(), start.end() - 1);
    for (uint32_t i : by_llm) order[at[rank[i]]++] = i;
  }
  const bool vision = kind == EncoderKind::kVision;
  const bool restricted = !availability.all();
  // Remote loads found in item order (the step's records read and written
  // in sequence), their sources picked in the order above: per item, the
  // drawn rank of its sample, then the source; kNone where it is local.
  constexpr uint32_t kLocal = ~0u;
  thread_local std::vector<uint32_t> source;
  source.assign(restricted ? items : 0, kLocal);
  if (restricted) {
    for (uint32_t i = 0; i < items; ++i) {
      if (!availability.Has(f.problem.shard[i], node[rank[i]])) {
        source[i] = step->samples[f.sample[i]].drawn_rank;
      }
    }
  }
  std::vector<double> cost(W, 0.0);
  for (uint32_t i : order) {
    cost[rank[i]] += f.problem.cost[i];
    if (restricted && source[i] != kLocal) {
      source[i] = sources->Pick(f.problem.shard[i], source[i], f.in_bytes[i]);
    }
  }
  for (uint32_t i = 0; i < items; ++i) {
    const bool remote = restricted && source[i] != kLocal;
    const uint32_t r = rank[i], from = remote ? source[i] : r;
    if (vision) {
      packer::PlannedImage& im = step->images[i];
      im.enc_rank = r;
      im.remote_load = remote;
      im.load_source = from;
    } else {
      packer::PlannedAudio& au = step->audio[i];
      au.enc_rank = r;
      au.remote_load = remote;
      au.load_source = from;
    }
  }
  return cost;
}

// The phases of the drawn split, for imbalance_before (unpadded LLM cost
// needs no packing: it is the sum of the documents' costs).
void DrawnImbalance(const StepPlanData& step, const std::array<FlatEncoder, kNumEncoders>& flat,
                    const LlmProblem& llm, const DispatchOptions& o,
                    std::array<double, kNumEncoders>* encoders, double* llm_before) {
  const uint32_t W = o.cluster.world_size;
  const uint32_t n = static_cast<uint32_t>(step.samples.size());
  for (int e = 0; e < kNumEncoders; ++e) {
    std::vector<double> cost(W, 0.0);
    for (size_t i = 0; i < flat[e].sample.size(); ++i) {
      cost[step.samples[flat[e].sample[i]].drawn_rank] += flat[e].problem.cost[i];
    }
    (*encoders)[e] = MakePhaseSummary(cost, 0).imbalance;
  }
  std::vector<double> cost(W, 0.0);
  if (o.padded) {
    std::vector<uint32_t> drawn(n);
    for (uint32_t s = 0; s < n; ++s) drawn[s] = step.samples[s].drawn_rank;
    uint32_t overflow = 0;
    cost = SplitLlmCosts(llm, drawn, &overflow);
  } else {
    const CostModel model(o.cost);
    for (uint32_t s = 0; s < n; ++s) {
      cost[step.samples[s].drawn_rank] += model.Llm(llm.docs[s].tokens);
    }
  }
  *llm_before = MakePhaseSummary(cost, 0).imbalance;
}

}  // namespace

namespace {

// Writes a placement to the step (steps 3 and 4 of Dispatch): every sample's
// LLM rank and sequence, every encoder item's rank, remote loads and their
// sources, and the phase summaries with the drawn split as "before".
void WritePlacement(const ShardAvailability& availability, const StagingIndex& staging,
                    const DispatchOptions& o, const std::array<FlatEncoder, kNumEncoders>& flat,
                    const RearrangementInstance& inst, const LlmAssignment& assignment,
                    StepPlanData* step) {
  const ClusterShape& c = o.cluster;
  const uint32_t W = c.world_size;
  const uint32_t n = static_cast<uint32_t>(step->samples.size());
  const bool restricted = !availability.all();
  const LlmProblem& llm = inst.problem;
  std::vector<uint32_t> node(W);  // node of every rank (no division in the loops below)
  for (uint32_t r = 0; r < W; ++r) node[r] = c.node_of(r);

  // Samples: LLM rank and sequence; remote token ids in LLM order, after
  // the encoder items' loads, so that sources are picked deterministically.
  const uint32_t S = o.slots.sequences();
  std::vector<uint32_t> slot_start, llm_order;
  LlmOrder(assignment, W, S, &slot_start, &llm_order);
  // A remote document's load, read in batch order (samples are large
  // records: LLM order would visit them scattered), its source picked in
  // LLM order below and written back in batch order.
  struct TextLoad {
    uint32_t shard, drawn;  // drawn: the drawn rank, then the source picked
    uint64_t bytes;
    bool remote;
  };
  thread_local std::vector<TextLoad> text;
  text.resize(restricted ? n : 0);
  for (uint32_t k = 0; k < n; ++k) {
    packer::PlannedSample& ps = step->samples[k];
    ps.rank = assignment.rank[k];
    ps.seq = assignment.seq[k];
    ps.text_remote = false;
    ps.text_source = ps.rank;
    if (restricted) {
      text[k] = TextLoad{ps.shard, ps.drawn_rank, uint64_t{ps.cost.text_tokens} * o.token_id_bytes,
                         !availability.Has(ps.shard, node[ps.rank])};
    }
  }
  LoadSources sources(availability, staging, c);
  std::array<std::vector<double>, kNumEncoders> enc_cost;
  for (int e = 0; e < kNumEncoders; ++e) {
    enc_cost[e] = PlaceEncoderItems(kEncoders[e], flat[e], inst.encoder_rank[e], llm_order,
                                    availability, node, &sources, step);
  }
  if (restricted) {
    constexpr size_t kAhead = 16;  // LLM order reads `text` scattered: fetched ahead
    for (size_t j = 0; j < llm_order.size(); ++j) {
      if (j + kAhead < llm_order.size()) __builtin_prefetch(&text[llm_order[j + kAhead]], 1);
      TextLoad& t = text[llm_order[j]];
      if (t.remote) t.drawn = sources.Pick(t.shard, t.drawn, t.bytes);
    }
    for (uint32_t k = 0; k < n; ++k) {
      if (!text[k].remote) continue;
      packer::PlannedSample& ps = step->samples[k];
      ps.text_remote = true;
      ps.text_source = text[k].drawn;
    }
  }

  // Statistics, with the drawn split as "before".
  std::array<double, kNumEncoders> enc_before{};
  double llm_before = 1;
  DrawnImbalance(*step, flat, llm, o, &enc_before, &llm_before);
  PhaseSummary* enc_phase[kNumEncoders] = {&step->vit, &step->audio_phase};
  for (int e = 0; e < kNumEncoders; ++e) {
    *enc_phase[e] = PhaseSummary();
    if (flat[e].sample.empty()) continue;
    *enc_phase[e] = MakePhaseSummary(enc_cost[e], inst.encoder_lower_bound[e]);
    enc_phase[e]->bound = inst.encoder_bound[e];
    enc_phase[e]->imbalance_before = enc_before[e];
  }
  step->llm = MakePhaseSummary(LlmRankCosts(llm, assignment), inst.llm_lower_bound);
  step->llm.bound = llm.bound;
  step->llm.imbalance_before = llm_before;
  step->phases_from_dispatcher = true;
}

}  // namespace

absl::Status Dispatch(const ShardAvailability& availability, const DispatchOptions& options,
                      StepPlanData* step) {
  const DispatchOptions o = WithSeqLen(*step, options);
  RETURN_IF_ERROR(ValidateStep(*step, availability, o));

  // 1. Encoder phases and the LLM problem.
  std::array<FlatEncoder, kNumEncoders> flat;
  LlmAssignment balanced;
  const StagingIndex staging(availability);
  ASSIGN_OR_RETURN(RearrangementInstance inst,
                   Stage(*step, availability, o, staging, &flat, &balanced));
  LlmProblem& llm = inst.problem;

  // 2. The LLM placement (node-aware: the rearrangement), then encoder items
  // pulled onto their sample's LLM node where the encoder bound allows.
  LlmAssignment assignment;
  RearrangeStats stats;
  if (o.node_aware) {
    ASSIGN_OR_RETURN(assignment,
                     Rearrange(o, (1 + o.balance_tolerance) * inst.llm_lower_bound, &llm, &stats));
    for (int e = 0; e < kNumEncoders; ++e) {
      const FlatEncoder& f = flat[e];
      if (f.sample.empty()) continue;
      std::vector<uint32_t> preferred(f.sample.size());
      for (size_t i = 0; i < f.sample.size(); ++i) {
        preferred[i] = o.cluster.node_of(assignment.rank[f.sample[i]]);
      }
      const std::vector<uint8_t> touched = MoveTowardNodes(
          f.problem, preferred, f.out_bytes, inst.encoder_bound[e], &inst.encoder_rank[e]);
      ImproveWithinNodes(f.problem, o.improvement_rounds, &inst.encoder_rank[e], &touched);
      // Balance bought back with the fewest bytes, down to the tolerance.
      RebalanceFewestBytes(f.problem, preferred, f.out_bytes, f.in_bytes,
                           (1 + o.balance_tolerance) * inst.encoder_lower_bound[e],
                           o.improvement_rounds, &inst.encoder_rank[e]);
    }
  } else {
    assignment = std::move(balanced);
  }

  // 3-4. Samples, encoder items, loads and statistics.
  WritePlacement(availability, staging, o, flat, inst, assignment, step);
  step->rearrangement = std::move(stats.rearrangement);
  step->llm_fallback = stats.llm_fallback;
  return absl::OkStatus();
}

absl::Status ApplyPlacement(const ShardAvailability& availability, const DispatchOptions& options,
                            const GivenPlacement& placement, StepPlanData* step) {
  const DispatchOptions o = WithSeqLen(*step, options);
  RETURN_IF_ERROR(ValidateStep(*step, availability, o));
  const uint32_t W = o.cluster.world_size;
  const StagingIndex staging(availability);
  std::array<FlatEncoder, kNumEncoders> flat;
  RearrangementInstance inst;
  for (EncoderKind kind : kEncoders) {
    const int e = static_cast<int>(kind);
    flat[e] = Flatten(*step, availability, o, kind, &staging);
    const std::vector<uint32_t>& rank = placement.encoder_rank[e];
    if (rank.size() != flat[e].sample.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the given placement has ", rank.size(), " ", EncoderPhaseName(kind),
                       " items; the step has ", flat[e].sample.size()));
    }
    for (uint32_t r : rank) {
      if (r >= W) {
        return absl::InvalidArgumentError(absl::StrCat("the given placement puts an ",
                                                       EncoderPhaseName(kind), " item on rank ", r,
                                                       ", outside world_size ", W));
      }
    }
    inst.encoder_lower_bound[e] = MakespanLowerBound(flat[e].problem.cost, W);
    inst.encoder_bound[e] = Makespan(flat[e].problem.cost, W, rank);  // no bound but its own
    inst.encoder_rank[e] = rank;
  }
  inst.problem = MakeLlmProblem(*step, o);
  inst.llm_lower_bound = LlmLowerBound(inst.problem);
  RETURN_IF_ERROR(CheckLlmAssignment(inst.problem, placement.llm, false));
  const std::vector<double> llm_cost = LlmRankCosts(inst.problem, placement.llm);
  inst.problem.bound = *std::max_element(llm_cost.begin(), llm_cost.end());
  WritePlacement(availability, staging, o, flat, inst, placement.llm, step);
  step->rearrangement = placement.name;
  step->llm_fallback = false;
  return absl::OkStatus();
}

}  // namespace tutti::dispatch
