#include "tools/sim/cluster.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tutti::sim {
namespace {

// Achieved shares of peak assumed where no calibration says otherwise:
// matmuls of large models at 40%, fused attention kernels at 35% (their
// backward pass runs well below the forward's rate).
ClusterSpec Node(std::string name, double peak, double hbm, double hbm_bw, double nvlink,
                 double network) {
  ClusterSpec c;
  c.name = std::move(name);
  c.ranks_per_node = 8;
  c.peak_flops = peak;
  c.util_vit = 0.40;
  c.util_audio = 0.40;
  c.util_llm = 0.40;
  c.util_attention = 0.35;
  c.hbm_bytes = hbm;
  c.hbm_bandwidth = hbm_bw;
  c.nvlink_bandwidth = nvlink;
  c.network_bandwidth = network;
  c.decode_threads = 64;  // of a node's ~112 cores, the rest left to the trainer
  return c;
}

absl::Status Check(const std::string& field, double v, bool share) {
  if (!std::isfinite(v) || v <= 0 || (share && v > 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster ", field, " is ", v, "; it must be a positive number",
                     share ? " no larger than 1 (a share of peak)" : ""));
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& ClusterPresetNames() {
  static const auto* names = new std::vector<std::string>{"h100", "h200", "b200"};
  return *names;
}

absl::StatusOr<ClusterSpec> ClusterPreset(const std::string& name) {
  // Dense bf16 peak, HBM size and bandwidth, NVLink per direction, and one
  // 400 Gb/s NIC per GPU.
  if (name == "h100") return Node(name, 989e12, 80e9, 3.35e12, 450e9, 50e9);
  if (name == "h200") return Node(name, 989e12, 141e9, 4.8e12, 450e9, 50e9);
  if (name == "b200") return Node(name, 2250e12, 180e9, 8e12, 900e9, 50e9);
  return absl::NotFoundError(absl::StrCat("cluster preset '", name, "' is unknown; choose one of: ",
                                          absl::StrJoin(ClusterPresetNames(), ", ")));
}

absl::Status ValidateCluster(const ClusterSpec& c) {
  if (c.ranks_per_node == 0) {
    return absl::InvalidArgumentError("cluster ranks_per_node is 0; a node runs at least one rank");
  }
  const struct {
    const char* name;
    double value;
    bool share;
  } fields[] = {{"peak_flops", c.peak_flops, false},
                {"util_vit", c.util_vit, true},
                {"util_audio", c.util_audio, true},
                {"util_llm", c.util_llm, true},
                {"util_attention", c.util_attention, true},
                {"hbm_bytes", c.hbm_bytes, false},
                {"hbm_bandwidth", c.hbm_bandwidth, false},
                {"nvlink_bandwidth", c.nvlink_bandwidth, false},
                {"network_bandwidth", c.network_bandwidth, false},
                {"decode_threads", static_cast<double>(c.decode_threads), false}};
  for (const auto& f : fields) {
    if (absl::Status s = Check(f.name, f.value, f.share); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<SyncModel> ParseSyncModel(const std::string& name) {
  if (name == "allreduce") return SyncModel::kAllReduce;
  if (name == "fsdp") return SyncModel::kFsdp;
  return absl::InvalidArgumentError(
      absl::StrCat("synchronisation model '", name, "' is unknown; choose allreduce or fsdp"));
}

const char* SyncModelName(SyncModel sync) {
  return sync == SyncModel::kAllReduce ? "allreduce" : "fsdp";
}

absl::StatusOr<Attention> ParseAttention(const std::string& name) {
  if (name == "flash") return Attention::kFlash;
  if (name == "eager") return Attention::kEager;
  return absl::InvalidArgumentError(
      absl::StrCat("attention '", name, "' is unknown; choose flash or eager"));
}

ItemTiming TimingFromShape(const ModelShape& m, const ClusterSpec& c, Attention attention) {
  ItemTiming t;
  const FlopTerms vit = VisionFlopTerms(m), audio = AudioFlopTerms(m), llm = LlmFlopTerms(m);
  const double attn_rate = c.peak_flops * c.util_attention;
  t.vit_linear = vit.linear / (c.peak_flops * c.util_vit);
  t.vit_quadratic = vit.quadratic / attn_rate;
  if (attention == Attention::kEager) {
    t.vit_quadratic += 24.0 * m.vision.heads * m.vision.layers / c.hbm_bandwidth;
  }
  t.audio_linear = audio.linear / (c.peak_flops * c.util_audio);
  t.audio_quadratic = audio.quadratic / attn_rate;
  t.llm_linear = llm.linear / (c.peak_flops * c.util_llm);
  t.llm_quadratic = llm.quadratic / attn_rate;
  return t;
}

double StateBytes(const ModelShape& m, SyncModel sync, uint32_t world_size) {
  const double params = m.total_params();
  const double W = std::max<uint32_t>(1, world_size);
  if (sync == SyncModel::kAllReduce) return 4 * params + 12 * params / W;
  // The largest layer gathered, twice (the next one prefetched).
  const double layer =
      std::max({m.vision.params / std::max<uint32_t>(1, m.vision.layers),
                m.audio.present() ? m.audio.params / std::max<uint32_t>(1, m.audio.layers) : 0.0,
                m.llm.params / std::max<uint32_t>(1, m.llm.layers)});
  return 16 * params / W + 2 * 2 * layer;
}

double VitActivationBytes(const ModelShape& m, double patches, double largest, Attention a) {
  const double d = m.vision.hidden, L = m.vision.layers;
  double bytes = patches * (L * 2 * d + 34 * d);
  if (a == Attention::kEager) bytes += 5.0 * m.vision.heads * largest * largest;
  return bytes;
}

double LlmActivationBytes(const ModelShape& m, double tokens) {
  const double d = m.llm.hidden, L = m.llm.layers;
  return tokens * (L * 2 * d + 34 * d);
}

}  // namespace tutti::sim
