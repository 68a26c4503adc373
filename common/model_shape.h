// A vision-language model's shape (its encoders and LLM) and what follows
// from it: training FLOPs per item, with the attention terms that grow with
// the square of an image's patches or a document's tokens, and the cost
// model's constants (cost_model.h), so that p_ref and the LLM's attention
// weight come from the model instead of being typed in.
//
// Training FLOPs (forward + backward = 3 x forward, matmuls only):
//   encoder, one item of m positions:  6 P m + 12 L d m^2   (bidirectional)
//   LLM, one document of n tokens:     6 A n +  6 L d n^2   (causal: half)
// P: encoder parameters, A: the LLM's active parameters per token (all of
// them for a dense model), L layers, d hidden size. A vision item's
// positions are its patches; an audio item's are positions_per_token per
// LLM token it yields.
#ifndef TUTTI_COMMON_MODEL_SHAPE_H_
#define TUTTI_COMMON_MODEL_SHAPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cost_model.h"

namespace tutti {

struct EncoderShape {
  double params = 0;  // 0: the model has no such encoder
  uint32_t hidden = 0;
  uint32_t layers = 0;
  uint32_t heads = 0;
  // Vision: pixels per patch side and patches merged per LLM token side
  // (Qwen2-VL: 14 and 2). Audio: 0.
  uint32_t patch_size = 0;
  uint32_t merge_size = 0;
  // Audio: encoder positions per LLM token (Whisper's 50 Hz frames pooled to
  // 25 Hz: 2). Vision: 1 (the cost model counts patches).
  uint32_t positions_per_token = 1;
  bool present() const { return params > 0; }
};

struct LlmShape {
  double params = 0;         // all parameters (memory)
  double active_params = 0;  // per token (FLOPs): params for a dense model
  uint32_t hidden = 0;
  uint32_t layers = 0;
  uint32_t heads = 0;
  uint32_t kv_heads = 0;
};

struct ModelShape {
  std::string name;
  std::string description;
  EncoderShape vision;
  EncoderShape audio;  // absent in a vision-language model
  LlmShape llm;

  double total_params() const { return vision.params + audio.params + llm.params; }
};

// The presets: "vit400m-moe16b-a3b" (the seed's 400M ViT with patch 16 and a
// 16B-A3B MoE LLM), "vit675m-dense7b" (Qwen2-VL-7B: a 675M ViT with patch 14
// and a 7.6B dense LLM) and "vit675m-whisper-dense7b" (the same with a
// Whisper-large-v3 audio encoder: three modalities).
const std::vector<std::string>& ModelPresetNames();
// NOT_FOUND naming the preset and the known ones.
absl::StatusOr<ModelShape> ModelPreset(const std::string& name);

// INVALID_ARGUMENT naming the first field that is zero, negative or
// inconsistent (e.g. active parameters above all parameters).
absl::Status ValidateModelShape(const ModelShape& shape);

// Training FLOPs of one item (see above).
double VisionFlops(const ModelShape& m, double patches);
double AudioFlops(const ModelShape& m, double tokens);
double LlmFlops(const ModelShape& m, double tokens);
// The linear and quadratic parts apart: flops = linear * x + quadratic * x^2.
struct FlopTerms {
  double linear = 0, quadratic = 0;
};
FlopTerms VisionFlopTerms(const ModelShape& m);
FlopTerms AudioFlopTerms(const ModelShape& m);
FlopTerms LlmFlopTerms(const ModelShape& m);

// The cost model's constants from the shape, in units of one LLM token's
// linear FLOPs (llm_linear = 1): every phase on one scale, the quadratic
// terms in the proportion the attention FLOPs give. A model without an audio
// encoder keeps the audio defaults of CostModelOptions.
CostModelOptions ShapeCostOptions(const ModelShape& m);

}  // namespace tutti

#endif  // TUTTI_COMMON_MODEL_SHAPE_H_
