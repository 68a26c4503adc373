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
// Everything here is plain data: no I/O, no proto. Indices named `sample` are
// positions in DispatchInput::samples, not sample ids.
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

// One image or audio clip: the unit of an encoder phase.
struct EncoderItem {
  uint32_t index = 0;          // image_index / audio_index within its sample
  uint32_t units = 0;          // vision: patches; audio: encoder tokens (the cost argument)
  uint32_t output_tokens = 0;  // LLM tokens its encoder output occupies
  uint64_t input_bytes = 0;    // bytes the encoder reads: pixel values / audio samples
  // Descriptive fields carried into the plan (not used by the algorithms).
  uint32_t height = 0;  // vision: resized height and width in pixels
  uint32_t width = 0;
  uint32_t grid_t = 0, grid_h = 0, grid_w = 0;  // vision: grid_thw in patches
  uint32_t frames = 0;                          // audio: input frames
};

struct Sample {
  uint64_t sample_id = 0;
  uint32_t shard = 0;        // the shard holding the sample's members
  uint32_t drawn_rank = 0;   // the rank the sampler dealt it to
  bool vl = false;           // VL (images and/or audio) or text-only
  uint32_t llm_tokens = 0;   // document length: text + encoder tokens + markers
  uint32_t text_tokens = 0;  // token ids read from the text member
  std::array<std::vector<EncoderItem>, kNumEncoders> items;  // by EncoderKind
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

struct DispatchInput {
  std::vector<Sample> samples;
  ShardAvailability availability;
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
  // Place items and samples to minimise inter-node bytes (default) or ignore
  // nodes (the baseline the node-aware plan is measured against).
  bool node_aware = true;
  // Balance constraint of the node-aware placements: every rank's phase cost
  // is at most (1 + balance_tolerance) x the phase's lower bound, or, when
  // the node-aware greedy cannot reach that, (1 + balance_tolerance) x the
  // makespan of the node-oblivious balancer. Locality is sought only within
  // it; a smaller tolerance trades inter-node bytes for balance. Default 1%.
  double balance_tolerance = 0.01;
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
  // Build the per-rank send/receive lists (DispatchPlan::forward, load).
  // false leaves them empty for a caller that lays out its own lists from
  // the placement (the packer's planner); statistics are computed either
  // way. Default true.
  bool build_exchanges = true;
};

// ---- results ----

// An encoder item, named by its sample and its position in
// samples[sample].items[encoder].
struct ItemRef {
  uint32_t sample = 0;
  uint32_t item = 0;
};

struct EncoderPhasePlan {
  EncoderKind kind = EncoderKind::kVision;
  // Per rank, the items it encodes, ordered by (LLM rank, LLM order): the
  // concatenated outputs are then the rank's forward send buffer for this
  // encoder, peer by peer.
  std::vector<std::vector<ItemRef>> rank_items;
  std::vector<double> rank_cost;
  // Indexed like the flattened items (sample order, then item order); see
  // DispatchPlan::item_offset.
  std::vector<uint32_t> rank;         // encoder rank of each item
  std::vector<uint8_t> remote_load;   // 1: shard not staged on the encoder rank's node
  std::vector<uint32_t> load_source;  // rank that loads and sends its input when remote
};

struct SequencePlan {
  std::vector<uint32_t> docs;  // sample indices, in sequence order
  uint32_t tokens = 0;
};

struct MicroBatchPlan {
  bool vl = false;
  std::vector<SequencePlan> sequences;
};

struct RankLlmPlan {
  std::vector<MicroBatchPlan> micro_batches;  // text micro-batches first
  double cost = 0;
};

// What an exchange entry carries.
enum class Payload : uint8_t {
  kEncoderOutput = 0,  // embeddings: output_tokens * hidden_size * dtype bytes
  kEncoderInput = 1,   // a remote-loaded item's pixels / audio samples
  kTextTokens = 2,     // a remote-loaded sample's token ids
};

struct ExchangeItem {
  uint32_t sample = 0;
  EncoderKind encoder = EncoderKind::kVision;  // unused for kTextTokens
  Payload payload = Payload::kEncoderOutput;
  uint32_t index = 0;  // image_index / audio_index; 0 for kTextTokens
  uint64_t bytes = 0;
};

struct Transfer {
  uint32_t peer = 0;
  uint64_t bytes = 0;
  std::vector<ExchangeItem> items;
};

// One rank's side of an all-to-all. Layout as documented on tutti.v1.Exchange:
// sends and recvs ordered by peer rank (self included), each transfer's items
// in the same order on both sides.
struct RankExchange {
  std::vector<Transfer> sends;
  std::vector<Transfer> recvs;
  uint64_t send_bytes = 0;
  uint64_t recv_bytes = 0;
  uint64_t inter_node_send_bytes = 0;
};

struct PhaseStats {
  std::string phase;              // "vit", "audio", "llm"
  double max = 0;                 // largest rank cost
  double mean = 0;                // mean rank cost
  double imbalance = 1;           // max / mean
  double lower_bound = 0;         // max(mean, largest single item)
  double imbalance_vs_bound = 1;  // max / lower_bound
  double imbalance_before = 1;    // max / mean of the drawn split
  double bound = 0;               // the balance bound the placement kept to
};

struct DispatchStats {
  std::vector<PhaseStats> phases;    // "vit", "audio" (when present), "llm"
  uint64_t inter_node_bytes = 0;     // forward exchange, between nodes
  uint64_t intra_node_bytes = 0;     // forward exchange, within a node, not to self
  uint64_t self_bytes = 0;           // forward exchange, rank to itself
  uint64_t remote_load_bytes = 0;    // load exchange (always between nodes)
  uint32_t remote_load_items = 0;    // encoder items loaded on another node
  uint32_t remote_text_samples = 0;  // samples whose token ids come from another node
  bool llm_fallback = false;         // node-aware LLM greedy missed the bound; fixed by search
  // How the LLM placement was chosen: "fast", "ilp optimal", or
  // "ilp: <why not>, fast kept".
  std::string rearrangement = "fast";
};

struct DispatchPlan {
  ClusterShape cluster;
  SlotLayout slots;
  // item_offset[e][s] is the flat index of samples[s].items[e][0];
  // item_offset[e][samples] is that encoder's item count.
  std::array<std::vector<uint32_t>, kNumEncoders> item_offset;
  std::array<EncoderPhasePlan, kNumEncoders> encoders;
  std::vector<RankLlmPlan> llm;       // per rank
  std::vector<uint32_t> llm_rank;     // per sample
  std::vector<uint32_t> llm_seq;      // per sample: sequence slot within its rank (text first)
  std::vector<uint8_t> text_remote;   // per sample: token ids come from text_source
  std::vector<uint32_t> text_source;  // per sample (meaningful when text_remote)
  // Empty unless DispatchOptions::build_exchanges.
  std::vector<RankExchange> forward;  // encoder outputs, encoder rank -> LLM rank
  std::vector<RankExchange> load;     // remote inputs, before the encoders run
  DispatchStats stats;
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
