// The planning core's result for one step, as flat arrays (no per-sample
// allocations; buffers are reused when a StepPlanData is planned into
// again). plan_proto.h turns it into a tutti.v1.StepPlan.
#ifndef TUTTI_SERVICES_PACKER_CORE_PLAN_DATA_H_
#define TUTTI_SERVICES_PACKER_CORE_PLAN_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "services/packer/core/costs.h"
#include "services/packer/core/packing.h"

namespace tutti::packer {

// Bytes of one token id in input_ids (int32), as a remote load carries them.
inline constexpr uint32_t kTokenIdBytes = 4;

struct PlannedSample {
  uint32_t sample = 0;       // index sample id
  uint32_t shard = 0;        // index shard holding its members
  uint32_t drawn_rank = 0;   // the rank that drew it (round-robin deal)
  uint32_t rank = 0;         // LLM-phase rank
  uint32_t seq = 0;          // sequence within the rank: text sequences first, then VL
  uint32_t first_image = 0;  // its images: images[first_image, first_image + cost.images)
  uint32_t first_audio = 0;
  // Post-balancing: the shard is not staged on the LLM rank's node, so its
  // token ids come through the load exchange from text_source.
  uint32_t text_source = 0;
  bool text_remote = false;
  bool vl = false;
  // The source it was drawn from (Job::source_name): a mixture's source, or
  // 0 text-only and 1 VL without one.
  uint8_t source = 0;
  // A document longer than seq_len (overflow.h): piece `piece` of `pieces`
  // (pieces 0: the whole document), its text tokens from text_begin
  // (cost.text_tokens of them); truncated: its text was cut to fit.
  bool truncated = false;
  uint32_t piece = 0, pieces = 0;
  uint32_t text_begin = 0;
  SampleCost cost;  // at the step's stage
  // Its stream position (sampler.h): the step whose draw it belongs to is
  // position / the stream's samples per step (earlier than the plan's step
  // when it was deferred).
  uint64_t position = 0;
};

// What the overflow policy did in a step (tutti.v1.OverflowStats).
struct OverflowCounts {
  uint32_t deferred_in = 0, deferred_out = 0;
  uint32_t split_documents = 0, split_pieces = 0, truncated = 0, skipped = 0;
  uint64_t oldest_deferred_step = 0;  // of the samples still waiting after the step
  bool fallback_packing = false;
  bool any() const {
    return deferred_in || deferred_out || split_documents || truncated || skipped ||
           fallback_packing;
  }
};

// Samples waiting for a later step: stream positions, oldest first.
struct DeferralQueue {
  std::vector<uint64_t> text, vl;
  bool empty() const { return text.empty() && vl.empty(); }
  size_t size() const { return text.size() + vl.size(); }
  bool operator==(const DeferralQueue& o) const { return text == o.text && vl == o.vl; }
};

struct PlannedImage {
  uint32_t owner = 0;        // index into samples
  uint32_t media = 0;        // index media id
  uint32_t image_index = 0;  // position among the sample's images
  uint32_t height = 0, width = 0, grid_h = 0, grid_w = 0;
  uint32_t patches = 0;
  uint32_t llm_tokens = 0;
  uint32_t enc_rank = 0;
  // Post-balancing: the shard is not staged on the encoder rank's node, so
  // the pixels come through the load exchange from load_source.
  uint32_t load_source = 0;
  bool remote_load = false;
  double cost = 0;
  uint64_t output_bytes = 0;
  uint64_t input_bytes = 0;  // pixel_values bytes (patches x row bytes)
};

struct PlannedAudio {
  uint32_t owner = 0;
  uint32_t media = 0;
  uint32_t audio_index = 0;
  uint32_t frames = 0;
  uint32_t tokens = 0;
  double cost = 0;
  uint32_t enc_rank = 0;
  uint64_t output_bytes = 0;
  uint64_t input_bytes = 0;  // audio_values bytes (float32 samples)
  bool remote_load = false;  // as PlannedImage
  uint32_t load_source = 0;
};

struct RankTotals {
  double vit = 0, llm = 0, audio = 0;
  uint64_t llm_tokens = 0, image_tokens = 0, patches = 0;
  uint32_t images = 0, samples = 0;
};

struct PhaseSummary {
  double max = 0, mean = 0, imbalance = 1, lower_bound = 0, imbalance_before = 1;
  // Post-balancing: the balance bound the placement kept to (max <= bound).
  double bound = 0;
};

// A compressed-row list: the items of row r are items[begin[r], begin[r+1]).
struct Csr {
  std::vector<uint32_t> begin;
  std::vector<uint32_t> items;
  uint32_t rows() const { return begin.empty() ? 0 : static_cast<uint32_t>(begin.size() - 1); }
  uint32_t size(uint32_t r) const { return begin[r + 1] - begin[r]; }
  const uint32_t* row(uint32_t r) const { return items.data() + begin[r]; }
};

// An encoder item in an exchange list: images are 0..I-1, audio clips I..
// A load item (load exchange) likewise, and the token ids of sample k are
// item I + A + k.
struct StepPlanData {
  uint64_t step = 0;
  uint64_t epoch = 0;       // text_epoch, or vl_epoch when the step draws no text
  uint64_t text_epoch = 0;  // each stream's epoch at its first sample of the step
  uint64_t vl_epoch = 0;
  uint32_t stage = 0;
  uint64_t max_pixels = 0;
  uint32_t seq_len = 0;
  uint32_t world_size = 0;
  uint32_t ranks_per_node = 1;
  uint32_t text_seqs = 0;  // per rank
  uint32_t vl_seqs = 0;    // per rank
  // The cost constants the step was planned with: the job config's, or an
  // online fit's (cost_schedule.h) when cost_fit > 0 (its id; in force from
  // cost_fit_from).
  CostModelOptions cost;
  uint32_t cost_fit = 0;
  uint64_t cost_fit_from = 0;

  std::vector<PlannedSample> samples;  // global batch: text samples, then VL, in draw order
  std::vector<PlannedImage> images;    // batch order
  std::vector<PlannedAudio> audio;
  // With locality (Job::homes()): every shard the step's samples read, each
  // once, in first-use order over `samples` (ListStepShards). The wire plan
  // names, for the nodes it is cut for, those they are home to
  // (StepPlan.held_shards); kept here so that cutting a plan for a few ranks
  // does not walk the whole batch. Empty without locality.
  std::vector<uint32_t> step_shards;

  Csr docs;        // row rank * (text_seqs + vl_seqs) + seq -> samples (batch order)
  Csr enc_images;  // row rank -> images it encodes (the order of its sends)
  Csr enc_audio;   // row rank -> audio clips it encodes (likewise)
  Csr chunks;      // row = chunk id -> positions in its rank's enc_images row
  std::vector<uint32_t> rank_chunks;  // chunk ids of rank r: [rank_chunks[r], rank_chunks[r+1])
  std::vector<uint64_t> chunk_patches;
  Csr sends;  // row rank -> encoder items it sends, by peer (exchange.h)
  Csr recvs;  // row rank -> encoder items it receives, by peer
  // Post-balancing moved some encoder item to another rank than the one
  // that encodes it: a pair's items are then its images and then its audio
  // clips, each in the LLM rank's input_ids order, and enc_images /
  // enc_audio follow the sends (exchange.h). False: batch order.
  bool items_move = false;
  // Post-balancing's load exchange (remote inputs, before the encoders run):
  // load items, by (peer, item); empty when every input is loaded locally.
  Csr load_sends;
  Csr load_recvs;

  std::vector<RankTotals> ranks;
  PhaseSummary vit, llm, audio_phase;
  // Set when the dispatcher measured the phases itself (post-balancing: its
  // cost variant, e.g. padded LLM cost); the planner's summary then keeps them.
  bool phases_from_dispatcher = false;
  bool has_audio = false;
  uint64_t inter_node_bytes = 0;   // forward exchange, between nodes
  uint64_t intra_node_bytes = 0;   // forward exchange, between ranks of a node
  uint64_t remote_load_bytes = 0;  // load exchange (always between nodes)
  std::string rearrangement;       // post-balancing: how the LLM placement was chosen
  bool llm_fallback = false;       // post-balancing: the node-aware greedy missed the bound
  double plan_seconds = 0;         // set by whoever timed the planner (not part of identity)
  // The overflow policy (overflow.h): its counts, the queue entering the
  // step, what waits after it, and the stream positions of the documents it
  // skipped (text and VL).
  OverflowCounts overflow;
  DeferralQueue deferred_in, deferred_out;
  std::vector<uint64_t> skipped_text, skipped_vl;

  // Inputs of the packing strategy (colocated dispatcher), in batch order.
  std::vector<PackItem> text_items, vl_items;
  // The admission's window before the admitted samples, as items (tokens and
  // image tokens only), for the first-fit fallback (overflow.h).
  std::vector<PackItem> text_lead, vl_lead;

  uint32_t seqs_per_rank() const { return text_seqs + vl_seqs; }
  uint32_t num_encoder_items() const { return static_cast<uint32_t>(images.size() + audio.size()); }
  uint32_t EncRank(uint32_t item) const {
    return item < images.size() ? images[item].enc_rank : audio[item - images.size()].enc_rank;
  }
  uint32_t LlmRank(uint32_t item) const {
    const uint32_t owner =
        item < images.size() ? images[item].owner : audio[item - images.size()].owner;
    return samples[owner].rank;
  }
  uint64_t OutputBytes(uint32_t item) const {
    return item < images.size() ? images[item].output_bytes
                                : audio[item - images.size()].output_bytes;
  }
  // Load items (see above): source rank, destination rank, bytes and owner.
  uint32_t num_load_items() const { return num_encoder_items() + uint32_t(samples.size()); }
  bool IsRemoteLoad(uint32_t item) const {
    const uint32_t I = uint32_t(images.size()), A = uint32_t(audio.size());
    return item < I       ? images[item].remote_load
           : item < I + A ? audio[item - I].remote_load
                          : samples[item - I - A].text_remote;
  }
  uint32_t LoadSource(uint32_t item) const {
    const uint32_t I = uint32_t(images.size()), A = uint32_t(audio.size());
    return item < I       ? images[item].load_source
           : item < I + A ? audio[item - I].load_source
                          : samples[item - I - A].text_source;
  }
  uint32_t LoadDest(uint32_t item) const {
    const uint32_t I = uint32_t(images.size()), A = uint32_t(audio.size());
    return item < I + A ? EncRank(item) : samples[item - I - A].rank;
  }
  uint32_t LoadOwner(uint32_t item) const {  // the sample (index into samples)
    const uint32_t I = uint32_t(images.size()), A = uint32_t(audio.size());
    return item < I ? images[item].owner : item < I + A ? audio[item - I].owner : item - I - A;
  }
  uint64_t LoadBytes(uint32_t item) const {
    const uint32_t I = uint32_t(images.size()), A = uint32_t(audio.size());
    return item < I       ? images[item].input_bytes
           : item < I + A ? audio[item - I].input_bytes
                          : uint64_t{samples[item - I - A].cost.text_tokens} * kTokenIdBytes;
  }
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_PLAN_DATA_H_
