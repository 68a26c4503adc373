#include "services/packer/core/tutti_place.h"

#include "absl/strings/str_cat.h"
#include "services/packer/core/overflow.h"

namespace tutti::packer::tutti_internal {

void Bounds(const PackProblem& p, State* st) {
  double vit_lb = 0, llm_lb = 0, vit_sum = 0, llm_sum = 0;
  for (const PackItem& it : p.text) {
    llm_sum += it.llm;
    llm_lb = std::max(llm_lb, it.llm);
  }
  for (const PackItem& it : p.vl) {
    llm_sum += it.llm;
    llm_lb = std::max(llm_lb, it.llm);
    vit_sum += it.vit;
    vit_lb = std::max(vit_lb, it.vit);
  }
  st->vit_lb = std::max(vit_lb, vit_sum / p.ranks);
  st->llm_lb = std::max(llm_lb, llm_sum / p.ranks);
  st->llm_budget = st->llm_lb * (1 + kGiantSlack);
}

absl::Status NoRoom(const PackProblem& p, const Side& side, const PackItem& it) {
  uint64_t tokens = 0;
  for (const PackItem& x : side.items) tokens += x.tokens;
  const bool cap = side.vl && p.img_cap > 0;
  return CapacityError(
      side.vl ? "VL" : "text", tokens, p.ranks, side.rooms.per(), p.seq_len,
      absl::StrCat("no sequence has room left for a sample of ", it.tokens, " tokens",
                   cap ? absl::StrCat(" and ", it.image_tokens, " image tokens") : ""));
}

}  // namespace tutti::packer::tutti_internal
