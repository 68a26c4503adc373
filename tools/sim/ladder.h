// What tutti is worth, in seconds: a workload planned step by step with the
// packer's planning core (the plans tutti-packerd would serve) under each
// rung of an ablation ladder, timed by the time model (time_model.h) on a
// model (common/model_shape.h) and a cluster (cluster.h):
//
//   naive                  random mini-batches (each rank its round-robin
//                          share of the shuffled batch), packed in order,
//                          text and images mixed in every micro-batch with
//                          the encoder inside each; read from NFS in the
//                          training loop (no prefetch, no deadline); the
//                          top max_pixels from the first step
//   + staging, prefetch    read from the node's NVMe cache, a prefetch
//                          window, a deadline per image
//   + modality segregation text and VL micro-batches apart, the encoder
//                          once per step (packing strategy "sequential":
//                          the drawn deal, first fit into the rank's
//                          sequences)
//   + max-pixel curriculum the stage's max_pixels (below the top one early
//                          in training)
//   + seed-v1, + seed-v2   the seed's bin packing (image tokens; ViT cost)
//   + post-balancing       OrchMLLM's re-deal per phase, node-aware exchange
//   tutti                  tutti's packing strategy
//
// For each rung: step time, tokens/s, idle share per phase (1 - mean/max
// rank time), exchange and stall time, peak activation memory per rank,
// and efficiency against the ideal step and against text-only training of
// the same tokens (time_model.h), with the per-rank load spread.
#ifndef TUTTI_TOOLS_SIM_LADDER_H_
#define TUTTI_TOOLS_SIM_LADDER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_shape.h"
#include "services/packer/bench/bench_workload.h"
#include "services/packer/index/index.h"
#include "tools/sim/cluster.h"
#include "tools/sim/data_path.h"
#include "tools/sim/time_model.h"
#include "tutti/v1/job.pb.h"

namespace tutti::sim {

struct SimSetup {
  ModelShape model;
  ClusterSpec cluster;
  // Each is evaluated on the same plans (a result per model).
  std::vector<SyncModel> syncs = {SyncModel::kAllReduce};
  Attention attention = Attention::kFlash;
  ItemTiming timing;                     // seconds per item (TimingFromShape or calibration)
  DataPathOptions data;                  // tutti's data path; rungs before staging read NFS
  packer::SeedWorkloadOptions workload;  // seq_len, sequences per rank, fill, seed
  std::shared_ptr<const packer::Index> index;
  uint64_t from = 0;
  uint64_t steps = 10;
  uint64_t top_max_pixels = packer::kSeedStage2MaxPixels;  // without a curriculum
};

struct Rung {
  std::string id;  // for --rungs: naive, staging, segregation, curriculum, seed-v1, seed-v2,
                   // post-balancing, tutti
  std::string name;
  bool mixed = false;  // the naive placement (NaiveWork)
  std::string strategy = "sequential";
  bool post_balancing = false;
  bool staged = true;
  bool prefetch = true;
  bool curriculum = true;
};
const std::vector<Rung>& LadderRungs();

struct RungResult {
  std::string rung;
  SyncModel sync = SyncModel::kAllReduce;
  uint32_t world_size = 0;
  uint64_t max_pixels = 0;
  uint64_t steps = 0;
  double step_seconds = 0;  // mean
  double tokens_per_second = 0;
  double tokens_per_second_per_gpu = 0;
  std::array<double, kPhaseKinds> idle_share{};  // per phase kind (exchange: 0)
  double exchange_seconds = 0;
  double stall_seconds = 0;
  double peak_activation_bytes = 0;
  double state_bytes = 0;
  bool fits_memory = true;
  double efficiency_ideal = 0;      // sum of ideal steps / sum of steps
  double efficiency_text_only = 0;  // sum of text-only steps / sum of steps
  // Sum of ideal steps / sum of bounds (time_model.h): the highest
  // efficiency_ideal any placement of whole items reaches.
  double efficiency_bound = 0;
  double inter_node_bytes = 0;  // per step, forward exchange
  // Each rank's compute over the mean rank's, every step: quantiles 0, 5,
  // 25, 50, 75, 95, 100 %.
  std::array<double, 7> spread{};
};

// The job config of a rung at `max_pixels` (defaults applied): the
// workload's batch for the world, the model's patch and merge sizes and
// hidden size, and cost constants proportional to the timing's.
v1::JobConfig RungConfig(const SimSetup& setup, const packer::SeedStepShape& shape,
                         uint32_t world_size, const Rung& rung, uint64_t max_pixels);

// INVALID_ARGUMENT / FAILED_PRECONDITION naming what is wrong: the model,
// the cluster, the data path, a model whose weights and optimizer states do
// not fit a GPU, a workload without a modality the ladder needs.
absl::Status ValidateSetup(const SimSetup& setup, uint32_t world_size);

// The global batch of the workload at `world_size` (its samples per step,
// sized at the top max_pixels and kept for every rung and stage).
absl::StatusOr<packer::SeedStepShape> LadderShape(const SimSetup& setup, uint32_t world_size);

// One result per setup.syncs.
absl::StatusOr<std::vector<RungResult>> RunRung(const SimSetup& setup,
                                                const packer::SeedStepShape& shape,
                                                uint32_t world_size, const Rung& rung,
                                                uint64_t stage_max_pixels);

absl::StatusOr<std::vector<RungResult>> RunLadder(const SimSetup& setup, uint32_t world_size,
                                                  uint64_t stage_max_pixels,
                                                  const std::vector<std::string>& only_ids = {});

}  // namespace tutti::sim

#endif  // TUTTI_TOOLS_SIM_LADDER_H_
