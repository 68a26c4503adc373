// The seed's open-bin heuristics (greedy = N 1, seed-v1, seed-v2), kept as
// baselines. Each modality is packed on its own into packs of at most
// seq_len tokens and img_cap image tokens; packs are dealt to sequence slots
// in order (pack i -> rank i % W, sequence i / W).
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/packer/core/packing.h"

namespace tutti::packer {
namespace {

class SeedStrategy final : public PackingStrategy {
 public:
  SeedStrategy(std::string name, uint32_t open_bins, bool vit_cost)
      : name_(std::move(name)), open_bins_(open_bins), vit_cost_(vit_cost) {}

  const std::string& name() const override { return name_; }

  absl::Status Pack(const PackProblem& p, PackResult* out) const override {
    out->text_slot.resize(p.text.size());
    out->vl_slot.resize(p.vl.size());
    if (absl::Status s = PackOne(p, p.text, p.text_seqs_per_rank, "text", out->text_slot.data());
        !s.ok()) {
      return s;
    }
    return PackOne(p, p.vl, p.vl_seqs_per_rank, "VL", out->vl_slot.data());
  }

 private:
  struct Bin {
    uint32_t id;
    uint32_t tokens;
    uint32_t image_tokens;
    double vit;
    uint32_t items;
  };

  absl::Status PackOne(const PackProblem& p, absl::Span<const PackItem> items, uint32_t seqs,
                       absl::string_view modality, uint32_t* slot) const {
    if (items.empty()) return absl::OkStatus();
    // bin id of every item, then pack number of every bin (in emit order).
    thread_local std::vector<uint32_t> bin_of;
    thread_local std::vector<uint32_t> pack_of_bin;
    thread_local std::vector<Bin> open;
    bin_of.resize(items.size());
    pack_of_bin.clear();
    open.clear();
    uint32_t packs = 0;
    uint64_t total_tokens = 0;
    auto emit = [&](const Bin& b) { pack_of_bin[b.id] = packs++; };
    auto new_bin = [&]() {
      pack_of_bin.push_back(UINT32_MAX);
      return Bin{static_cast<uint32_t>(pack_of_bin.size() - 1), 0, 0, 0.0, 0};
    };
    // N bins are open from the start (empty bins attract the first items);
    // never more than the step has sequence slots.
    const uint64_t slots = uint64_t{p.ranks} * seqs;
    const uint64_t n_open = std::min<uint64_t>(open_bins_, slots);
    for (uint64_t b = 0; b < n_open; ++b) open.push_back(new_bin());
    for (size_t i = 0; i < items.size(); ++i) {
      const PackItem& it = items[i];
      total_tokens += it.tokens;
      if (it.tokens > p.seq_len || (p.img_cap > 0 && it.image_tokens > p.img_cap)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "a ", modality, " sample of ", it.tokens, " tokens (", it.image_tokens,
            " image tokens) is larger than one sequence (seq_len ", p.seq_len, ", img_cap ",
            p.img_cap, "); raise seq_len/img_cap_tokens or lower max_pixels"));
      }
      int best = -1;
      double best_key = 0;
      for (size_t b = 0; b < open.size(); ++b) {
        const Bin& bin = open[b];
        if (bin.tokens + it.tokens > p.seq_len) continue;
        if (p.img_cap > 0 && bin.image_tokens + it.image_tokens > p.img_cap) continue;
        double key;
        if (it.image_tokens > 0) {
          key = vit_cost_ ? bin.vit : static_cast<double>(bin.image_tokens);
        } else {
          key = bin.tokens;
        }
        if (best < 0 || key < best_key) {
          best = static_cast<int>(b);
          best_key = key;
        }
      }
      if (best < 0) {
        {
          size_t fullest = 0;
          for (size_t b = 1; b < open.size(); ++b) {
            if (open[b].tokens > open[fullest].tokens) fullest = b;
          }
          emit(open[fullest]);
          open[fullest] = new_bin();
          best = static_cast<int>(fullest);
        }
      }
      Bin& bin = open[best];
      bin.tokens += it.tokens;
      bin.image_tokens += it.image_tokens;
      bin.vit += it.vit;
      ++bin.items;
      bin_of[i] = bin.id;
    }
    for (const Bin& b : open) {
      if (b.items > 0) emit(b);
    }
    if (packs > slots) {
      return CapacityError(
          modality, total_tokens, p.ranks, seqs, p.seq_len,
          absl::StrCat(name_, " made ", packs, " packs for ", slots, " sequence slots"));
    }
    for (size_t i = 0; i < items.size(); ++i) {
      const uint32_t pack = pack_of_bin[bin_of[i]];
      slot[i] = (pack % p.ranks) * seqs + pack / p.ranks;
    }
    return absl::OkStatus();
  }

  std::string name_;
  uint32_t open_bins_;
  bool vit_cost_;
};

}  // namespace

std::unique_ptr<PackingStrategy> MakeSeedStrategy(std::string name, uint32_t open_bins,
                                                  bool balance_vit_cost) {
  return std::make_unique<SeedStrategy>(std::move(name), open_bins, balance_vit_cost);
}

}  // namespace tutti::packer
