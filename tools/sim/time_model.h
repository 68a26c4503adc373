// A step's time from what each rank does in it.
//
// A step is a sequence of segments, each with a time per rank: encoder
// passes, the exchange between encoders and LLM (post-balancing), and the
// LLM's micro-batches. How ranks wait for each other follows the
// synchronisation model (cluster.h):
//   fsdp:       every segment ends when its slowest rank ends:
//                 compute = sum over segments of max over ranks
//   allreduce:  ranks meet only at the end of the step and at exchanges:
//                 compute = sum over the runs of segments between meetings
//                 of max over ranks of the rank's time in the run
//                 (+ each exchange's slowest rank)
// and the step = data stall + compute (data_path.h). The ideal step is the
// same work perfectly balanced with no stall and no exchange (the mean
// rank's compute); text-only training of the same tokens is the mean rank's
// LLM time alone. The bound is the fastest any placement of whole items
// could be: an image is encoded whole on one rank, so the rank that encodes
// the step's most costly one spends at least that on it (allreduce: the step
// is at least max(ideal, that image); fsdp: the encoder pass is at least
// max(its mean, that image), the other phases at least their means).
#ifndef TUTTI_TOOLS_SIM_TIME_MODEL_H_
#define TUTTI_TOOLS_SIM_TIME_MODEL_H_

#include <array>
#include <cstdint>
#include <vector>

#include "tools/sim/cluster.h"
#include "tools/sim/data_path.h"

namespace tutti::sim {

enum PhaseKind { kVit = 0, kAudio = 1, kLlm = 2, kExchange = 3, kPhaseKinds = 4 };
const char* PhaseKindName(int kind);  // "vit", "audio", "llm", "exchange"

struct Segment {
  PhaseKind kind = kLlm;
  std::vector<double> seconds;  // per rank
};

struct StepWork {
  uint32_t world_size = 0;
  std::vector<Segment> segments;
  uint64_t llm_tokens = 0;               // every rank's LLM tokens (text, image and audio tokens)
  std::vector<double> activation_bytes;  // per rank, its peak over the step
  std::vector<std::vector<DataItem>> node_items;        // images each node reads and decodes
  uint64_t inter_node_bytes = 0, intra_node_bytes = 0;  // the forward exchange
  double largest_vit_seconds = 0;                       // the step's most costly image
};

struct StepTime {
  double compute = 0;    // segments, as the sync model adds them
  double stall = 0;      // waiting for data
  double step = 0;       // stall + compute
  double ideal = 0;      // the mean rank's compute, no exchange
  double bound = 0;      // the fastest a placement of whole items can be (>= ideal)
  double text_only = 0;  // the mean rank's LLM time
  double exchange = 0;   // the exchanges' slowest ranks
  // Per phase kind: the mean rank's time, and its slowest rank's.
  std::array<double, kPhaseKinds> mean{}, max{};
  std::vector<double> rank_compute;  // each rank's own compute (no waiting)
  double peak_activation_bytes = 0;
};

// Compute, ideal and the phases of a step (stall left 0: the caller adds
// the data pipeline's).
StepTime EvaluateStep(const StepWork& work, SyncModel sync);

}  // namespace tutti::sim

#endif  // TUTTI_TOOLS_SIM_TIME_MODEL_H_
