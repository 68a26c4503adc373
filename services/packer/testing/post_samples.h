// Builders for dispatcher tests (test-only).
#ifndef TUTTI_SERVICES_PACKER_TESTING_POST_SAMPLES_H_
#define TUTTI_SERVICES_PACKER_TESTING_POST_SAMPLES_H_

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "services/packer/core/post_balancing/dispatch_types.h"

namespace tutti::dispatch::testing {

inline Sample Text(uint64_t id, uint32_t tokens, uint32_t drawn = 0, uint32_t shard = 0) {
  Sample s;
  s.sample_id = id;
  s.shard = shard;
  s.drawn_rank = drawn;
  s.llm_tokens = s.text_tokens = tokens;
  return s;
}

// A VL sample with images of the given patch counts (LLM tokens = patches/4)
// and `text` text tokens; llm_tokens counts two markers per image.
inline Sample Vl(uint64_t id, std::initializer_list<uint32_t> patches, uint32_t text,
                 uint32_t drawn = 0, uint32_t shard = 0) {
  Sample s;
  s.sample_id = id;
  s.shard = shard;
  s.drawn_rank = drawn;
  s.vl = true;
  s.text_tokens = text;
  s.llm_tokens = text;
  uint32_t k = 0;
  for (uint32_t p : patches) {
    EncoderItem it;
    it.index = k++;
    it.units = p;
    it.output_tokens = p / 4;
    it.input_bytes = PixelBytes(p, 2, 14, 4);
    it.grid_t = 1, it.grid_h = 2, it.grid_w = p / 2;
    it.height = 28, it.width = 7 * p;
    s.items[int(EncoderKind::kVision)].push_back(it);
    s.llm_tokens += it.output_tokens + 2;
  }
  return s;
}

// Adds an audio clip of `tokens` encoder tokens to a (VL) sample.
inline void AddAudio(Sample* s, uint32_t tokens) {
  EncoderItem it;
  it.index = static_cast<uint32_t>(s->items[int(EncoderKind::kAudio)].size());
  it.units = it.output_tokens = tokens;
  it.frames = tokens * 4;
  it.input_bytes = uint64_t{tokens} * 4 * 160 * 4;
  s->items[int(EncoderKind::kAudio)].push_back(it);
  s->llm_tokens += tokens + 2;
  s->vl = true;
}

inline DispatchOptions SmallOptions(uint32_t world, uint32_t per_node, uint32_t seq_len,
                                    uint32_t text_seqs = 1, uint32_t vl_seqs = 1) {
  DispatchOptions o;
  o.cluster = {world, per_node};
  o.slots.seq_len = seq_len;
  o.slots.text_micro_batches = text_seqs;
  o.slots.text_micro_batch = 1;
  o.slots.vl_micro_batches = vl_seqs;
  o.slots.vl_micro_batch = 1;
  o.hidden_size = 64;
  return o;
}

}  // namespace tutti::dispatch::testing

#endif  // TUTTI_SERVICES_PACKER_TESTING_POST_SAMPLES_H_
