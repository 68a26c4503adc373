#include "common/model_shape.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tutti {
namespace {

// SigLIP2-so400m/16: the seed's "400M ViT" with patch size 16 (a 4096 x 4096
// image is 65,536 patches, as the seed counts).
EncoderShape Vit400m() {
  EncoderShape e;
  e.params = 400e6;
  e.hidden = 1152;
  e.layers = 27;
  e.heads = 16;
  e.patch_size = 16;
  e.merge_size = 2;
  return e;
}

// Qwen2-VL's 675M ViT.
EncoderShape Vit675m() {
  EncoderShape e;
  e.params = 675e6;
  e.hidden = 1280;
  e.layers = 32;
  e.heads = 16;
  e.patch_size = 14;
  e.merge_size = 2;
  return e;
}

// Whisper-large-v3's encoder (Qwen2-Audio's): 50 Hz positions pooled to
// 25 Hz tokens.
EncoderShape Whisper() {
  EncoderShape e;
  e.params = 635e6;
  e.hidden = 1280;
  e.layers = 32;
  e.heads = 20;
  e.positions_per_token = 2;
  return e;
}

// Qwen2-7B.
LlmShape Dense7b() {
  LlmShape l;
  l.params = 7.6e9;
  l.active_params = 7.6e9;
  l.hidden = 3584;
  l.layers = 28;
  l.heads = 28;
  l.kv_heads = 4;
  return l;
}

// A 16B-A3B mixture of experts: 16B parameters, 3B active per token. The
// seed names the size only; hidden size and depth are those of MoE LLMs of
// that size (DeepSeek-V2-Lite: 2048, 27; Moonlight: 2048, 27).
LlmShape Moe16bA3b() {
  LlmShape l;
  l.params = 16e9;
  l.active_params = 3e9;
  l.hidden = 2048;
  l.layers = 28;
  l.heads = 16;
  l.kv_heads = 16;
  return l;
}

FlopTerms EncoderTerms(const EncoderShape& e) {
  if (!e.present()) return {};
  const double m = e.positions_per_token;
  return {6 * e.params * m, 12.0 * e.layers * e.hidden * m * m};
}

absl::Status Positive(const std::string& field, double v) {
  if (std::isfinite(v) && v > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("model ", field, " is ", v, "; it must be a positive number"));
}

}  // namespace

const std::vector<std::string>& ModelPresetNames() {
  static const auto* names = new std::vector<std::string>{"vit400m-moe16b-a3b", "vit675m-dense7b",
                                                          "vit675m-whisper-dense7b"};
  return *names;
}

absl::StatusOr<ModelShape> ModelPreset(const std::string& name) {
  ModelShape m;
  m.name = name;
  if (name == "vit400m-moe16b-a3b") {
    m.description = "400M ViT (patch 16) + 16B-A3B MoE LLM";
    m.vision = Vit400m();
    m.llm = Moe16bA3b();
  } else if (name == "vit675m-dense7b") {
    m.description = "675M ViT (patch 14) + 7.6B dense LLM";
    m.vision = Vit675m();
    m.llm = Dense7b();
  } else if (name == "vit675m-whisper-dense7b") {
    m.description = "675M ViT + 635M Whisper encoder + 7.6B dense LLM";
    m.vision = Vit675m();
    m.audio = Whisper();
    m.llm = Dense7b();
  } else {
    return absl::NotFoundError(absl::StrCat("model preset '", name, "' is unknown; choose one of: ",
                                            absl::StrJoin(ModelPresetNames(), ", ")));
  }
  return m;
}

absl::Status ValidateModelShape(const ModelShape& m) {
  const struct {
    const char* name;
    const EncoderShape& e;
  } encoders[] = {{"vision", m.vision}, {"audio", m.audio}};
  for (const auto& [name, e] : encoders) {
    if (e.params == 0 && std::string(name) == "audio") continue;
    const std::string p = absl::StrCat(name, ".");
    if (absl::Status s = Positive(p + "params", e.params); !s.ok()) return s;
    if (absl::Status s = Positive(p + "hidden", e.hidden); !s.ok()) return s;
    if (absl::Status s = Positive(p + "layers", e.layers); !s.ok()) return s;
    if (absl::Status s = Positive(p + "heads", e.heads); !s.ok()) return s;
    if (absl::Status s = Positive(p + "positions_per_token", e.positions_per_token); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = Positive("vision.patch_size", m.vision.patch_size); !s.ok()) return s;
  if (absl::Status s = Positive("vision.merge_size", m.vision.merge_size); !s.ok()) return s;
  if (absl::Status s = Positive("llm.params", m.llm.params); !s.ok()) return s;
  if (absl::Status s = Positive("llm.active_params", m.llm.active_params); !s.ok()) return s;
  if (absl::Status s = Positive("llm.hidden", m.llm.hidden); !s.ok()) return s;
  if (absl::Status s = Positive("llm.layers", m.llm.layers); !s.ok()) return s;
  if (absl::Status s = Positive("llm.heads", m.llm.heads); !s.ok()) return s;
  if (m.llm.active_params > m.llm.params) {
    return absl::InvalidArgumentError(absl::StrCat("model llm.active_params ", m.llm.active_params,
                                                   " is above llm.params ", m.llm.params,
                                                   "; a token uses at most all of the parameters"));
  }
  return absl::OkStatus();
}

FlopTerms VisionFlopTerms(const ModelShape& m) { return EncoderTerms(m.vision); }
FlopTerms AudioFlopTerms(const ModelShape& m) { return EncoderTerms(m.audio); }
FlopTerms LlmFlopTerms(const ModelShape& m) {
  return {6 * m.llm.active_params, 6.0 * m.llm.layers * m.llm.hidden};
}

double VisionFlops(const ModelShape& m, double p) {
  const FlopTerms t = VisionFlopTerms(m);
  return p * (t.linear + t.quadratic * p);
}
double AudioFlops(const ModelShape& m, double tokens) {
  const FlopTerms t = AudioFlopTerms(m);
  return tokens * (t.linear + t.quadratic * tokens);
}
double LlmFlops(const ModelShape& m, double n) {
  const FlopTerms t = LlmFlopTerms(m);
  return n * (t.linear + t.quadratic * n);
}

CostModelOptions ShapeCostOptions(const ModelShape& m) {
  CostModelOptions o;
  const FlopTerms llm = LlmFlopTerms(m);
  const double unit = llm.linear;
  o.llm_linear = 1;
  o.llm_quadratic = llm.quadratic / unit;
  const FlopTerms vit = VisionFlopTerms(m);
  o.vit_linear = vit.linear / unit;
  o.vit_quadratic = vit.quadratic / unit;
  if (m.audio.present()) {
    const FlopTerms audio = AudioFlopTerms(m);
    o.audio_linear = audio.linear / unit;
    o.audio_quadratic = audio.quadratic / unit;
  }
  return o;
}

}  // namespace tutti
