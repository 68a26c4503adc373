#include "services/packer/dispatch/pre_balance.h"

#include <algorithm>
#include <array>
#include <functional>
#include <numeric>
#include <queue>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/cost_model.h"
#include "services/packer/dispatch/sequence_state.h"

namespace tutti::dispatch {

absl::StatusOr<std::vector<uint32_t>> LptPreBalance(const DispatchInput& in,
                                                    const DispatchOptions& o) {
  const CostModel model(o.cost);
  const uint32_t W = o.cluster.world_size;
  const size_t n = in.samples.size();
  // Per sample: LLM cost and normalised encoder cost.
  std::vector<double> llm(n, 0.0), vit(n, 0.0), audio(n, 0.0), enc(n, 0.0);
  double vit_total = 0, audio_total = 0;
  for (size_t s = 0; s < n; ++s) {
    const Sample& x = in.samples[s];
    llm[s] = model.Llm(x.llm_tokens);
    for (const EncoderItem& it : x.items[int(EncoderKind::kVision)]) vit[s] += model.Vit(it.units);
    for (const EncoderItem& it : x.items[int(EncoderKind::kAudio)])
      audio[s] += model.Audio(it.units);
    vit_total += vit[s];
    audio_total += audio[s];
  }
  for (size_t s = 0; s < n; ++s) {
    if (vit_total > 0) enc[s] += vit[s] / vit_total;
    if (audio_total > 0) enc[s] += audio[s] / audio_total;
  }
  SequenceState seqs(o.cluster, o.slots, model, o.padded);
  std::vector<uint32_t> split(n, 0);
  // One LPT pass over the samples of one modality, keyed by `key`, loads in
  // `load` (the LLM pass reads the rank costs of `seqs`).
  auto pass = [&](bool vl, const std::vector<double>& key, bool llm_load) -> absl::Status {
    std::vector<uint32_t> order;
    for (uint32_t s = 0; s < n; ++s) {
      if (in.samples[s].vl == vl) order.push_back(s);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return key[a] > key[b]; });
    std::vector<double> load(W, 0.0);
    for (uint32_t r = 0; r < W && llm_load; ++r) load[r] = seqs.cost(r);
    using Entry = std::pair<double, uint32_t>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    for (uint32_t r = 0; r < W; ++r) heap.push({load[r], r});
    std::vector<Entry> skipped;
    for (uint32_t s : order) {
      const Sample& x = in.samples[s];
      skipped.clear();
      bool placed = false;
      while (!heap.empty()) {
        const Entry e = heap.top();
        heap.pop();
        uint32_t q;
        double delta;
        if (seqs.BestSequence(e.second, x.llm_tokens, x.vl, &q, &delta)) {
          seqs.Add(e.second, q, x.llm_tokens, llm[s]);
          load[e.second] = llm_load ? seqs.cost(e.second) : load[e.second] + key[s];
          split[s] = e.second;
          heap.push({load[e.second], e.second});
          placed = true;
          break;
        }
        skipped.push_back(e);
      }
      for (const Entry& e : skipped) heap.push(e);
      if (!placed) {
        return absl::ResourceExhaustedError(
            absl::StrCat("pre-balancing: sample ", x.sample_id, " (", x.llm_tokens,
                         " tokens) fits no rank's sequences; draw fewer samples per step"));
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status st = pass(true, enc, false); !st.ok()) return st;
  if (absl::Status st = pass(false, llm, true); !st.ok()) return st;
  return split;
}

}  // namespace tutti::dispatch
