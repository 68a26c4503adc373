// Per-item cost model shared by the packer's strategies and benchmarks.
//   ViT cost of an image of p patches:  a*p + b*p^2   (seed v2: p*(1+p/p_ref))
//   LLM cost of a document of n tokens: alpha*n + beta*n^2 (varlen attention)
//   audio encoder cost of t tokens:     c*t + d*t^2
#ifndef TUTTI_COMMON_COST_MODEL_H_
#define TUTTI_COMMON_COST_MODEL_H_

#include <cstdint>

namespace tutti {

struct CostModelOptions {
  double vit_linear = 1.0;
  double vit_quadratic = 1.0 / 4096.0;  // 1/p_ref
  double llm_linear = 1.0;
  double llm_quadratic = 1.0 / 8192.0;
  double audio_linear = 1.0;
  double audio_quadratic = 1.0 / 1500.0;
};

class CostModel {
 public:
  CostModel() = default;
  explicit CostModel(const CostModelOptions& opts) : o_(opts) {}

  double Vit(double patches) const { return patches * (o_.vit_linear + o_.vit_quadratic * patches); }
  double Llm(double tokens) const { return tokens * (o_.llm_linear + o_.llm_quadratic * tokens); }
  double Audio(double tokens) const {
    return tokens * (o_.audio_linear + o_.audio_quadratic * tokens);
  }
  const CostModelOptions& options() const { return o_; }

 private:
  CostModelOptions o_;
};

}  // namespace tutti

#endif  // TUTTI_COMMON_COST_MODEL_H_
