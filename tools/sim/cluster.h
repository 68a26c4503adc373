// The machines a simulated job runs on (`tutti simulate --cluster`), the
// synchronisation model of its training loop, and what an item costs there
// in seconds: from the model's FLOPs and the GPUs' achieved rates, or from
// calibration pairs measured on a GPU (calibration.h).
#ifndef TUTTI_TOOLS_SIM_CLUSTER_H_
#define TUTTI_TOOLS_SIM_CLUSTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_shape.h"

namespace tutti::sim {

// Per GPU unless said otherwise. Bandwidths are one direction.
struct ClusterSpec {
  std::string name;
  uint32_t ranks_per_node = 8;
  double peak_flops = 0;  // dense bf16 FLOP/s
  // Achieved share of peak on each phase's matmuls, and on attention
  // (FlashAttention-class kernels).
  double util_vit = 0;
  double util_audio = 0;
  double util_llm = 0;
  double util_attention = 0;
  double hbm_bytes = 0;
  double hbm_bandwidth = 0;      // bytes/s (what eager attention's score matrix costs)
  double nvlink_bandwidth = 0;   // bytes/s to a GPU of the same node
  double network_bandwidth = 0;  // bytes/s to other nodes
  uint32_t decode_threads = 0;   // per node: the stager's decode pool
};

// "h100", "h200", "b200": 8-GPU HGX/DGX nodes.
const std::vector<std::string>& ClusterPresetNames();
absl::StatusOr<ClusterSpec> ClusterPreset(const std::string& name);
// INVALID_ARGUMENT naming the first field that is zero, negative, not
// finite, or (utilisations) above 1.
absl::Status ValidateCluster(const ClusterSpec& cluster);

// How ranks meet: "allreduce" once per step (data parallel: the gradient
// all-reduce waits for the slowest rank; an exchange between phases is a
// meeting too), "fsdp" at every phase (sharded parameters are gathered per
// layer, so every encoder pass and every micro-batch waits for its slowest
// rank).
enum class SyncModel { kAllReduce, kFsdp };
absl::StatusOr<SyncModel> ParseSyncModel(const std::string& name);
const char* SyncModelName(SyncModel sync);

// The ViT's attention kernel: "flash" (fused, no score matrix in memory) or
// "eager" (the [heads, p, p] score matrix written to and read from memory).
enum class Attention { kFlash, kEager };
absl::StatusOr<Attention> ParseAttention(const std::string& name);

// Seconds of one item on one GPU, forward and backward:
//   seconds = linear * x + quadratic * x^2
// (x: an image's patches, an audio clip's tokens, a document's tokens).
struct ItemTiming {
  double vit_linear = 0, vit_quadratic = 0;
  double audio_linear = 0, audio_quadratic = 0;
  double llm_linear = 0, llm_quadratic = 0;
  double Vit(double p) const { return p * (vit_linear + vit_quadratic * p); }
  double Audio(double t) const { return t * (audio_linear + audio_quadratic * t); }
  double Llm(double n) const { return n * (llm_linear + llm_quadratic * n); }
};

// From the model's FLOPs (model_shape.h) at the cluster's achieved rates;
// with eager attention the ViT's quadratic term also pays for its score
// matrix crossing memory (about 24 bytes per head, layer and patch pair over
// forward and backward).
ItemTiming TimingFromShape(const ModelShape& model, const ClusterSpec& cluster,
                           Attention attention);

// Bytes a rank holds for the model's weights, gradients and Adam states:
// allreduce keeps bf16 weights and gradients whole and shards the fp32
// master weights and moments (12 bytes per parameter) over the ranks;
// fsdp shards all 16 bytes and gathers one layer's bf16 weights at a time
// (two, with prefetch).
double StateBytes(const ModelShape& model, SyncModel sync, uint32_t world_size);
// Activation bytes per item position kept through a step with per-layer
// activation checkpointing (every layer's bf16 input, and one layer's
// working set while it is recomputed: about 34 hidden-sized values per
// position, Korthikanti et al.); eager attention adds the one layer's score
// matrices (5 bytes per head and position pair) for its largest item.
double VitActivationBytes(const ModelShape& model, double patches, double largest_image,
                          Attention attention);
double LlmActivationBytes(const ModelShape& model, double tokens);

}  // namespace tutti::sim

#endif  // TUTTI_TOOLS_SIM_CLUSTER_H_
