#include "services/packer/core/dispatcher.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "services/packer/core/post_balancing/post_balancing.h"

namespace tutti::packer {
namespace {

// Each sample's rank and sequence from its slot (rank * per + sequence):
// `per` a constant of the loop for the usual few sequences a rank, so that
// the division is a multiplication.
template <uint32_t kPer>
void PlaceSlotsBy(const std::vector<uint32_t>& slots, uint32_t per, uint32_t first_seq,
                  absl::Span<PlannedSample> samples) {
  const uint32_t d = kPer > 0 ? kPer : per;
  for (size_t k = 0; k < samples.size(); ++k) {
    PlannedSample& ps = samples[k];
    ps.rank = slots[k] / d;
    ps.seq = first_seq + slots[k] % d;
    ps.text_remote = false;
    ps.text_source = ps.rank;
  }
}
void PlaceSlots(const std::vector<uint32_t>& slots, uint32_t per, uint32_t first_seq,
                absl::Span<PlannedSample> samples) {
  switch (per) {
    case 1:
      return PlaceSlotsBy<1>(slots, per, first_seq, samples);
    case 2:
      return PlaceSlotsBy<2>(slots, per, first_seq, samples);
    case 3:
      return PlaceSlotsBy<3>(slots, per, first_seq, samples);
    case 4:
      return PlaceSlotsBy<4>(slots, per, first_seq, samples);
    default:
      return PlaceSlotsBy<0>(slots, per, first_seq, samples);
  }
}

// Colocated packing with shards staged on some nodes only (locality): the
// strategy's rank bins are dealt to ranks so that each node's ranks hold as
// many of the input bytes their node stages as a greedy finds (a bin is a
// rank's whole work, so every rank's costs stay what the strategy balanced:
// a permutation of the ranks changes no balance), then every input whose
// shard the LLM rank's node does not stage is a remote load from a rank of a
// node that does. Deterministic: ties go to the lower bin, node and rank.
class ColocatedLocality {
 public:
  ColocatedLocality(const dispatch::ShardAvailability& staging, uint32_t world_size,
                    uint32_t ranks_per_node)
      : staging_(staging),
        index_(staging),
        W_(world_size),
        rpn_(std::max<uint32_t>(ranks_per_node, 1)),
        nodes_(world_size / rpn_),
        node_bytes_(nodes_, 0) {}

  void Apply(StepPlanData* plan) {
    Permute(plan);
    for (PlannedSample& ps : plan->samples) {
      ps.text_remote = !Local(ps.shard, ps.rank);
      ps.text_source =
          ps.text_remote ? Source(ps.shard, ps.rank, uint64_t{ps.cost.text_tokens} * kTokenIdBytes)
                         : ps.rank;
    }
    for (PlannedImage& im : plan->images) Place(plan->samples[im.owner], im.input_bytes, &im);
    for (PlannedAudio& au : plan->audio) Place(plan->samples[au.owner], au.input_bytes, &au);
  }

 private:
  bool Local(uint32_t shard, uint32_t rank) const { return staging_.Has(shard, rank / rpn_); }

  template <typename Item>
  void Place(const PlannedSample& owner, uint64_t bytes, Item* item) {
    item->enc_rank = owner.rank;
    item->remote_load = !Local(owner.shard, owner.rank);
    item->load_source = item->remote_load ? Source(owner.shard, owner.rank, bytes) : owner.rank;
  }

  // A rank of the staging node that sends the least so far; on it, the
  // rank with the destination's position in its node.
  uint32_t Source(uint32_t shard, uint32_t dest, uint64_t bytes) {
    uint32_t node = ~0u;
    for (const uint32_t* n = index_.begin(shard); n != index_.end(shard); ++n) {
      if (node == ~0u || node_bytes_[*n] < node_bytes_[node]) node = *n;
    }
    if (node == ~0u) return dest;  // staged nowhere: the dispatcher's caller refuses it
    node_bytes_[node] += bytes;
    return node * rpn_ + dest % rpn_;
  }

  // Bins (the strategy's ranks) to ranks, greedily by the bytes a bin has
  // staged on a node, most first.
  void Permute(StepPlanData* plan) const {
    if (nodes_ <= 1) return;
    std::vector<absl::flat_hash_map<uint32_t, uint64_t>> score(W_);
    auto add = [&](uint32_t bin, uint32_t shard, uint64_t bytes) {
      for (const uint32_t* n = index_.begin(shard); n != index_.end(shard); ++n) {
        score[bin][*n] += bytes;
      }
    };
    for (const PlannedSample& ps : plan->samples) {
      add(ps.rank, ps.shard, uint64_t{ps.cost.text_tokens} * kTokenIdBytes);
    }
    for (const PlannedImage& im : plan->images) {
      const PlannedSample& ps = plan->samples[im.owner];
      add(ps.rank, ps.shard, im.input_bytes);
    }
    for (const PlannedAudio& au : plan->audio) {
      const PlannedSample& ps = plan->samples[au.owner];
      add(ps.rank, ps.shard, au.input_bytes);
    }
    struct Pair {
      uint64_t bytes;
      uint32_t bin, node;
    };
    std::vector<Pair> pairs;
    for (uint32_t b = 0; b < W_; ++b) {
      for (const auto& [n, bytes] : score[b]) pairs.push_back({bytes, b, n});
    }
    std::sort(pairs.begin(), pairs.end(), [](const Pair& a, const Pair& b) {
      if (a.bytes != b.bytes) return a.bytes > b.bytes;
      return a.bin != b.bin ? a.bin < b.bin : a.node < b.node;
    });
    std::vector<uint32_t> node_of_bin(W_, ~0u), free(nodes_, rpn_);
    for (const Pair& p : pairs) {
      if (node_of_bin[p.bin] != ~0u || free[p.node] == 0) continue;
      node_of_bin[p.bin] = p.node;
      --free[p.node];
    }
    uint32_t open = 0;
    for (uint32_t b = 0; b < W_; ++b) {
      if (node_of_bin[b] != ~0u) continue;
      while (free[open] == 0) ++open;
      node_of_bin[b] = open;
      --free[open];
    }
    // Within a node, its bins in increasing order on its ranks.
    std::vector<uint32_t> rank_of_bin(W_), next(nodes_, 0);
    for (uint32_t b = 0; b < W_; ++b) {
      rank_of_bin[b] = node_of_bin[b] * rpn_ + next[node_of_bin[b]]++;
    }
    for (PlannedSample& ps : plan->samples) ps.rank = rank_of_bin[ps.rank];
  }

  const dispatch::ShardAvailability& staging_;
  const dispatch::StagingIndex index_;  // each shard's staging nodes, increasing
  const uint32_t W_, rpn_, nodes_;
  std::vector<uint64_t> node_bytes_;
};

class ColocatedDispatcher final : public Dispatcher {
 public:
  ColocatedDispatcher(const PackingStrategy* strategy, const DispatcherOptions& o)
      : strategy_(strategy), o_(o) {}

  const std::string& name() const override { return name_; }

  // Loads happen on the sample's LLM rank. With shards staged on some nodes
  // only (locality), the ranks' bins are dealt for locality first and what
  // is not staged on the LLM rank's node is a remote load
  // (ColocatedLocality).
  absl::Status Dispatch(const DispatchStep& step, StepPlanData* plan) const override {
    PackProblem p;
    p.ranks = o_.world_size;
    p.seq_len = plan->seq_len;
    p.img_cap = o_.img_cap;
    p.text_seqs_per_rank = plan->text_seqs;
    p.vl_seqs_per_rank = plan->vl_seqs;
    p.text = plan->text_items;
    p.vl = plan->vl_items;
    p.text_lead = plan->text_lead;
    p.vl_lead = plan->vl_lead;
    p.balance_vit = true;
    thread_local PackResult r;
    if (absl::Status s = strategy_->Pack(p, &r); !s.ok()) {
      return absl::IsFailedPrecondition(s) ? AsCapacityError(std::move(s)) : s;
    }
    const uint32_t T = static_cast<uint32_t>(plan->text_items.size());
    PlaceSlots(r.text_slot, plan->text_seqs, 0, absl::MakeSpan(plan->samples).subspan(0, T));
    PlaceSlots(r.vl_slot, plan->vl_seqs, plan->text_seqs, absl::MakeSpan(plan->samples).subspan(T));
    for (PlannedImage& im : plan->images) {
      im.enc_rank = im.load_source = plan->samples[im.owner].rank;
      im.remote_load = false;
    }
    for (PlannedAudio& au : plan->audio) {
      au.enc_rank = au.load_source = plan->samples[au.owner].rank;
      au.remote_load = false;
    }
    if (step.staging != nullptr && !step.staging->all()) {
      ColocatedLocality(*step.staging, o_.world_size, o_.ranks_per_node).Apply(plan);
    }
    plan->phases_from_dispatcher = false;
    plan->rearrangement.clear();
    return absl::OkStatus();
  }

 private:
  const std::string name_ = "colocated";
  const PackingStrategy* strategy_;
  DispatcherOptions o_;
};

class PostBalancingDispatcher final : public Dispatcher {
 public:
  explicit PostBalancingDispatcher(const DispatcherOptions& o) : base_(PostBalancingOptions(o)) {}

  const std::string& name() const override { return name_; }

  absl::Status Dispatch(const DispatchStep& step, StepPlanData* plan) const override {
    dispatch::DispatchOptions o = base_;
    o.cost = step.model->options();
    const dispatch::ShardAvailability everywhere;
    absl::Status s =
        dispatch::Dispatch(step.staging != nullptr ? *step.staging : everywhere, o, plan);
    // Samples that do not fit their sequences: the planner's contract says
    // FAILED_PRECONDITION for a step that cannot be planned.
    if (absl::IsResourceExhausted(s)) {
      return AsCapacityError(
          absl::FailedPreconditionError(absl::StrCat("post-balancing: ", s.message())));
    }
    if (absl::IsInvalidArgument(s)) {
      return absl::FailedPreconditionError(absl::StrCat("post-balancing: ", s.message()));
    }
    return s;
  }

 private:
  const std::string name_ = "post-balancing";
  dispatch::DispatchOptions base_;
};

// Post-balancing by a peer balancer, node-oblivious: the LLM phase is the
// peer's deal of the samples on LLM cost into the ranks' sequences (VL
// samples first, then text on top, as the peer packs), and each encoder
// phase the peer's partition of the encoder's items on their cost (one
// unbounded sequence per rank). The placement is written as the
// post-balancing library writes its own (dispatch::ApplyPlacement).
class PeerRedealDispatcher final : public Dispatcher {
 public:
  PeerRedealDispatcher(const PackingStrategy* peer, const DispatcherOptions& o)
      : peer_(peer), base_(PostBalancingOptions(o)), name_("post-balancing/" + peer->name()) {}

  const std::string& name() const override { return name_; }

  absl::Status Dispatch(const DispatchStep& step, StepPlanData* plan) const override {
    dispatch::DispatchOptions o = base_;
    o.cost = step.model->options();
    const uint32_t W = o.cluster.world_size;
    const uint32_t T = static_cast<uint32_t>(plan->text_items.size());
    dispatch::GivenPlacement g;
    g.name = peer_->name();
    PackProblem p;
    p.ranks = W;
    p.seq_len = plan->seq_len;
    p.img_cap = o.slots.img_cap;
    p.text_seqs_per_rank = plan->text_seqs;
    p.vl_seqs_per_rank = plan->vl_seqs;
    p.text = plan->text_items;
    p.vl = plan->vl_items;
    p.balance_vit = false;
    PackResult r;
    if (absl::Status s = peer_->Pack(p, &r); !s.ok()) {
      return absl::IsFailedPrecondition(s) ? AsCapacityError(std::move(s)) : s;
    }
    const size_t n = plan->samples.size();
    g.llm.rank.resize(n);
    g.llm.seq.resize(n);
    for (size_t k = 0; k < n; ++k) {
      const bool vl = k >= T;
      const uint32_t per = vl ? plan->vl_seqs : plan->text_seqs;
      const uint32_t slot = vl ? r.vl_slot[k - T] : r.text_slot[k];
      g.llm.rank[k] = slot / per;
      g.llm.seq[k] = (vl ? plan->text_seqs : 0) + slot % per;
    }
    for (dispatch::EncoderKind kind : dispatch::kEncoders) {
      const bool vision = kind == dispatch::EncoderKind::kVision;
      const size_t items = vision ? plan->images.size() : plan->audio.size();
      std::vector<PackItem> cost(items);
      for (size_t i = 0; i < items; ++i) {
        cost[i].tokens = 1;
        cost[i].vit = vision ? plan->images[i].cost : plan->audio[i].cost;
      }
      PackProblem e;
      e.ranks = W;
      e.seq_len = static_cast<uint32_t>(std::max<size_t>(1, items));  // never binds
      e.vl_seqs_per_rank = 1;
      e.vl = cost;
      e.balance_vit = true;
      if (absl::Status s = peer_->Pack(e, &r); !s.ok()) return s;
      g.encoder_rank[static_cast<int>(kind)] = std::move(r.vl_slot);
    }
    const dispatch::ShardAvailability everywhere;
    absl::Status s =
        dispatch::ApplyPlacement(step.staging != nullptr ? *step.staging : everywhere, o, g, plan);
    return absl::IsInvalidArgument(s)
               ? absl::FailedPreconditionError(absl::StrCat(name_, ": ", s.message()))
               : s;
  }

 private:
  const PackingStrategy* peer_;
  dispatch::DispatchOptions base_;
  const std::string name_;
};

}  // namespace

std::unique_ptr<Dispatcher> MakePeerRedealDispatcher(const PackingStrategy* peer,
                                                     const DispatcherOptions& options) {
  return std::make_unique<PeerRedealDispatcher>(peer, options);
}

std::unique_ptr<Dispatcher> MakeColocatedDispatcher(const PackingStrategy* strategy,
                                                    const DispatcherOptions& options) {
  return std::make_unique<ColocatedDispatcher>(strategy, options);
}

std::unique_ptr<Dispatcher> MakePostBalancingDispatcher(const DispatcherOptions& options) {
  return std::make_unique<PostBalancingDispatcher>(options);
}

dispatch::DispatchOptions PostBalancingOptions(const DispatcherOptions& o) {
  dispatch::DispatchOptions d;
  d.cluster = {o.world_size, o.ranks_per_node};
  d.slots.text_micro_batches = o.text_micro_batches;
  d.slots.text_micro_batch = o.text_micro_batch;
  d.slots.vl_micro_batches = o.vl_micro_batches;
  d.slots.vl_micro_batch = o.vl_micro_batch;
  d.slots.img_cap = o.img_cap;
  d.padded = o.padded;
  d.rearrangement = o.rearrangement;
  d.hidden_size = o.hidden_size;
  d.embedding_dtype_bytes = o.embedding_dtype_bytes;
  d.token_id_bytes = kTokenIdBytes;
  d.node_aware = o.node_aware;
  d.balance_tolerance = o.balance_tolerance;
  d.text_affinity = o.text_affinity;
  return d;
}

uint64_t IlpBinaries(const DispatcherOptions& o, uint64_t text_samples, uint64_t vl_samples) {
  return uint64_t{o.world_size} * (text_samples * o.text_micro_batches * o.text_micro_batch +
                                   vl_samples * o.vl_micro_batches * o.vl_micro_batch);
}

}  // namespace tutti::packer
