#include "services/packer/bench/strategy_split.h"

#include "common/cost_model.h"

namespace tutti::packer {

absl::StatusOr<std::vector<uint32_t>> StrategySplit(const PackingStrategy& strategy,
                                                    const dispatch::DispatchInput& in,
                                                    const dispatch::DispatchOptions& o) {
  constexpr int kV = static_cast<int>(dispatch::EncoderKind::kVision);
  const CostModel model(o.cost);
  std::vector<PackItem> text, vl;
  std::vector<uint32_t> text_sample, vl_sample;
  for (uint32_t s = 0; s < in.samples.size(); ++s) {
    const dispatch::Sample& x = in.samples[s];
    PackItem it;
    it.tokens = x.llm_tokens;
    it.llm = model.Llm(x.llm_tokens);
    for (const dispatch::EncoderItem& e : x.items[kV]) {
      it.image_tokens += e.output_tokens;
      it.vit += model.Vit(e.units);
    }
    (x.vl ? vl : text).push_back(it);
    (x.vl ? vl_sample : text_sample).push_back(s);
  }
  PackProblem p;
  p.ranks = o.cluster.world_size;
  p.seq_len = o.slots.seq_len;
  p.text_seqs_per_rank = o.slots.text_sequences();
  p.vl_seqs_per_rank = o.slots.vl_sequences();
  p.text = text;
  p.vl = vl;
  p.balance_vit = true;
  PackResult r;
  if (absl::Status s = strategy.Pack(p, &r); !s.ok()) return s;
  std::vector<uint32_t> split(in.samples.size(), 0);
  for (size_t k = 0; k < text_sample.size(); ++k) {
    split[text_sample[k]] = r.text_slot[k] / p.text_seqs_per_rank;
  }
  for (size_t k = 0; k < vl_sample.size(); ++k) {
    split[vl_sample[k]] = r.vl_slot[k] / p.vl_seqs_per_rank;
  }
  return split;
}

dispatch::PreBalanceFn MakeStrategyPreBalance(std::shared_ptr<const PackingStrategy> strategy) {
  return [strategy](const dispatch::DispatchInput& in, const dispatch::DispatchOptions& o) {
    return StrategySplit(*strategy, in, o);
  };
}

}  // namespace tutti::packer
