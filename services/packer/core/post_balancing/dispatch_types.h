// Inputs, options and results of batch post-balancing (the dispatcher).
//
// After the sampler has drawn a step's samples onto ranks, the dispatcher
// re-deals them across the data-parallel ranks once per phase:
//   - one encoder phase per encoder (vision, audio): every image or audio clip
//     is an item placed on one rank, balancing that encoder's cost; the rank
//     whose node stages the item's shard loads it ("loading follows the
//     encoder phase"), so pixels never cross the network unless the shard is
//     staged nowhere on that node (remote_load);
//   - the LLM phase: every sample is a document placed in one packed sequence
//     of one rank, text-only and VL samples in separate sequences, balancing
//     LLM cost under the seq_len capacity.
// The encoder outputs then travel from encoder rank to LLM rank in one
// all-to-all (Pi_M o Pi_E^-1); the backward pass uses its inverse.
//
// Text token ids are read by the LLM rank's own stager (they never travel
// from the drawn rank); only when the sample's shard is not staged on the LLM
// rank's node do they arrive through the load exchange (4 bytes per token).
//
// The step itself is the planner's StepPlanData (core/plan_data.h): the
// dispatcher reads the drawn samples, images and audio clips from it and
// writes the placement back. Everything here is plain data: no I/O, no proto.
#ifndef TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_DISPATCH_TYPES_H_
#define TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_DISPATCH_TYPES_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/cost_model.h"

namespace tutti::dispatch {

enum class EncoderKind : uint8_t { kVision = 0, kAudio = 1 };
inline constexpr int kNumEncoders = 2;
inline constexpr std::array<EncoderKind, kNumEncoders> kEncoders = {EncoderKind::kVision,
                                                                    EncoderKind::kAudio};
// Phase name used in statistics: "vit" or "audio".
const char* EncoderPhaseName(EncoderKind kind);

// Ranks are numbered node-major: rank r lives on node r / ranks_per_node.
struct ClusterShape {
  uint32_t world_size = 1;      // data-parallel ranks
  uint32_t ranks_per_node = 1;  // must divide world_size
  uint32_t nodes() const { return world_size / ranks_per_node; }
  uint32_t node_of(uint32_t rank) const { return rank / ranks_per_node; }
};

// The fixed per-rank sequence slots of a step. A rank's sequences are
// numbered text first: [0, text_sequences()) are text-only sequences, then
// VL sequences. Consecutive sequences of one modality form micro-batches.
struct SlotLayout {
  uint32_t seq_len = 8192;          // tokens per packed sequence (capacity)
  uint32_t text_micro_batches = 1;  // text micro-batches per rank per step
  uint32_t text_micro_batch = 1;    // sequences per text micro-batch
  uint32_t vl_micro_batches = 1;    // VL micro-batches per rank per step
  uint32_t vl_micro_batch = 1;      // sequences per VL micro-batch
  uint32_t img_cap = 0;             // image tokens per VL sequence; 0 = no cap

  uint32_t text_sequences() const { return text_micro_batches * text_micro_batch; }
  uint32_t vl_sequences() const { return vl_micro_batches * vl_micro_batch; }
  uint32_t sequences() const { return text_sequences() + vl_sequences(); }
  uint32_t micro_batches() const { return text_micro_batches + vl_micro_batches; }
  bool is_vl_sequence(uint32_t q) const { return q >= text_sequences(); }
  // The micro-batch (rank-local, text first) that sequence q belongs to.
  uint32_t micro_batch_of(uint32_t q) const {
    return q < text_sequences() ? q / text_micro_batch
                                : text_micro_batches + (q - text_sequences()) / vl_micro_batch;
  }
  uint32_t micro_batch_size(uint32_t mb) const {
    return mb < text_micro_batches ? text_micro_batch : vl_micro_batch;
  }
  uint32_t first_sequence(uint32_t mb) const {
    return mb < text_micro_batches ? mb * text_micro_batch
                                   : text_sequences() + (mb - text_micro_batches) * vl_micro_batch;
  }
};

// Which node's stager can read which shard. By default every shard is
// available on every node (production: any stager can stage any shard).
class ShardAvailability {
 public:
  ShardAvailability() = default;  // all shards on all nodes
  // A bitmap with nothing staged; mark what is with Set().
  static ShardAvailability None(uint32_t shards, uint32_t nodes);

  void Set(uint32_t shard, uint32_t node, bool staged);
  bool Has(uint32_t shard, uint32_t node) const;
  // Appends the nodes that stage `shard`, increasing (a word of the bitmap
  // at a time). Not for all().
  void AppendNodes(uint32_t shard, std::vector<uint32_t>* out) const;
  // Whether some node stages `shard` (a word of the bitmap at a time).
  bool AnyNode(uint32_t shard) const;
  bool all() const { return all_; }
  uint32_t shards() const { return shards_; }
  uint32_t nodes() const { return nodes_; }

 private:
  bool all_ = true;
  uint32_t shards_ = 0;
  uint32_t nodes_ = 0;
  std::vector<uint64_t> bits_;  // shard-major, one bit per (shard, node)
};

// Per shard, the list of nodes that stage it, built once from the bitmap
// (scanning a row of the bitmap per sample would cost O(nodes)).
class StagingIndex {
 public:
  explicit StagingIndex(const ShardAvailability& availability);
  // True when the shard is on every node (always when the bitmap is "all").
  bool everywhere(uint32_t shard) const {
    return all_ || (shard < everywhere_.size() && everywhere_[shard]);
  }
  // The staging nodes of a shard, increasing; empty when all().
  const uint32_t* begin(uint32_t shard) const { return nodes_.data() + offset_[shard]; }
  const uint32_t* end(uint32_t shard) const { return nodes_.data() + offset_[shard + 1]; }
  bool all() const { return all_; }

 private:
  bool all_ = true;
  std::vector<uint8_t> everywhere_;
  std::vector<uint32_t> offset_ = {0};
  std::vector<uint32_t> nodes_;
};

// How the node-aware LLM placement is chosen among the balanced ones.
enum class Rearrangement : uint8_t {
  kFast = 0,  // RearrangeLlm (llm_phase.h): production, any size
  kIlp = 1,   // the exact GLPK program (llm_ilp.h), started from kFast: small steps
};

struct DispatchOptions {
  ClusterShape cluster;
  SlotLayout slots;
  CostModelOptions cost;  // per-item costs (common/cost_model.h)
  // LLM cost of a micro-batch. false (default): unpadded varlen attention,
  // sum over documents of alpha*len + beta*len^2. true: padded, every
  // sequence of the micro-batch costs as the longest one,
  // sequences * (alpha*L + beta*L^2) with L the longest sequence's tokens.
  bool padded = false;
  uint32_t hidden_size = 4096;         // LLM hidden size (embedding bytes)
  uint32_t embedding_dtype_bytes = 2;  // bfloat16 encoder outputs
  uint32_t token_id_bytes = 4;         // int32 token ids (remote text loads)
  // Whether a document's token ids pull it toward the nodes that stage its
  // shard in the LLM placement (default true). false (shard homes, job
  // config locality): every document has a home node or two, its token ids
  // are a few KB that a holder's stager sends, and weighing them would tie
  // every document to its node; they are still marked remote (text_remote)
  // where the LLM rank's node does not stage the shard.
  bool text_affinity = true;
  // Place items and samples to minimise inter-node bytes (default) or ignore
  // nodes (the baseline the node-aware plan is measured against).
  bool node_aware = true;
  // Balance against inter-node bytes. The node-aware placements first seek
  // locality with every rank's phase cost within (1 + w) x the phase's
  // lower bound, w = max(balance_tolerance, locality_slack) (or, when the
  // node-aware greedy cannot reach that, (1 + w) x the makespan of the
  // node-oblivious balancer); then each phase is lowered to
  // (1 + balance_tolerance) x its lower bound by moves that add the fewest
  // bytes. A smaller tolerance trades inter-node bytes for balance.
  // Defaults 0.01% (a job's post_balancing.balance_tolerance default) and 1%.
  double balance_tolerance = 0.0001;
  double locality_slack = 0.01;
  // Run Karmarkar-Karp largest differencing (O(n * W log W)) besides LPT for
  // encoder phases with at most this many ranks; LPT alone above. Default 64.
  uint32_t kk_max_ranks = 64;
  // Bound on local-search passes per phase (each pass is O(items)). Default 4.
  uint32_t improvement_rounds = 4;
  // kIlp solves the LLM rearrangement exactly with GLPK, from the fast
  // placement and within its bound, and keeps the optimum when GLPK proves
  // one within ilp_max_nodes branch-and-bound nodes (a budget that does not
  // depend on the machine, so plans stay reproducible) and ilp_time_limit_s
  // (a safety net); otherwise the fast placement stays. Default kFast.
  Rearrangement rearrangement = Rearrangement::kFast;
  uint64_t ilp_max_nodes = 20000;  // default 20,000
  double ilp_time_limit_s = 60;    // default 60 s
};

// Bytes of the encoder output of an item with `tokens` LLM tokens.
inline uint64_t EmbeddingBytes(uint32_t tokens, const DispatchOptions& o) {
  return uint64_t{tokens} * o.hidden_size * o.embedding_dtype_bytes;
}

// Bytes of pixel_values for an image of `patches` patches:
// patches x 3 x temporal_patch x patch_size^2 x dtype bytes.
inline uint64_t PixelBytes(uint32_t patches, uint32_t temporal_patch, uint32_t patch_size,
                           uint32_t dtype_bytes) {
  return uint64_t{patches} * 3 * temporal_patch * patch_size * patch_size * dtype_bytes;
}

}  // namespace tutti::dispatch

#endif  // TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_DISPATCH_TYPES_H_
