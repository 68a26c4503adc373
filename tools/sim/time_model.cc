#include "tools/sim/time_model.h"

#include <algorithm>

namespace tutti::sim {

const char* PhaseKindName(int kind) {
  switch (kind) {
    case kVit:
      return "vit";
    case kAudio:
      return "audio";
    case kLlm:
      return "llm";
    default:
      return "exchange";
  }
}

StepTime EvaluateStep(const StepWork& w, SyncModel sync) {
  StepTime t;
  const uint32_t W = w.world_size;
  t.rank_compute.assign(W, 0.0);
  std::array<std::vector<double>, kPhaseKinds> per_kind;
  for (auto& v : per_kind) v.assign(W, 0.0);
  std::vector<double> run(W, 0.0);  // allreduce: each rank's time since the last meeting
  auto meet = [&]() {
    t.compute += W ? *std::max_element(run.begin(), run.end()) : 0;
    std::fill(run.begin(), run.end(), 0.0);
  };
  for (const Segment& s : w.segments) {
    double slowest = 0;
    for (uint32_t r = 0; r < W && r < s.seconds.size(); ++r) {
      slowest = std::max(slowest, s.seconds[r]);
      per_kind[s.kind][r] += s.seconds[r];
      if (s.kind != kExchange) t.rank_compute[r] += s.seconds[r];
    }
    if (s.kind == kExchange) {
      if (sync == SyncModel::kAllReduce) meet();
      t.compute += slowest;
      t.exchange += slowest;
    } else if (sync == SyncModel::kFsdp) {
      t.compute += slowest;
    } else {
      for (uint32_t r = 0; r < W && r < s.seconds.size(); ++r) run[r] += s.seconds[r];
    }
  }
  if (sync == SyncModel::kAllReduce) meet();
  for (int k = 0; k < kPhaseKinds; ++k) {
    double sum = 0;
    for (double x : per_kind[k]) sum += x, t.max[k] = std::max(t.max[k], x);
    t.mean[k] = W ? sum / W : 0;
  }
  t.ideal = t.mean[kVit] + t.mean[kAudio] + t.mean[kLlm];
  t.text_only = t.mean[kLlm];
  t.bound = sync == SyncModel::kAllReduce
                ? std::max(t.ideal, w.largest_vit_seconds)
                : std::max(t.mean[kVit], w.largest_vit_seconds) + t.mean[kAudio] + t.mean[kLlm];
  t.step = t.compute;
  for (double b : w.activation_bytes)
    t.peak_activation_bytes = std::max(t.peak_activation_bytes, b);
  return t;
}

}  // namespace tutti::sim
