#include "services/packer/core/seed_stream.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tutti::packer {

SeedStreamPacker::SeedStreamPacker(const SeedStreamOptions& options) : o_(options) {
  o_.open_bins = std::max<uint32_t>(1, o_.open_bins);
  open_.assign(o_.open_bins, StreamPack());
}

absl::Status SeedStreamPacker::Add(const PackItem& it, std::vector<StreamPack>* emitted) {
  if (it.tokens > o_.seq_len || (o_.img_cap > 0 && it.image_tokens > o_.img_cap)) {
    return absl::FailedPreconditionError(
        absl::StrCat("a sample of ", it.tokens, " tokens (", it.image_tokens,
                     " image tokens) is larger than one pack (seq_len ", o_.seq_len, ", img_cap ",
                     o_.img_cap, ")"));
  }
  const bool image = it.image_tokens > 0;
  int best = -1;
  double best_key = 0;
  for (size_t b = 0; b < open_.size(); ++b) {
    const StreamPack& bin = open_[b];
    if (bin.tokens + it.tokens > o_.seq_len) continue;
    if (o_.img_cap > 0 && bin.image_tokens + it.image_tokens > o_.img_cap) continue;
    const double key = !image ? bin.tokens : o_.vit_cost ? bin.vit : bin.image_tokens;
    if (best < 0 || key < best_key) best = static_cast<int>(b), best_key = key;
  }
  if (best < 0) {
    size_t fullest = 0;
    for (size_t b = 1; b < open_.size(); ++b) {
      if (open_[b].tokens > open_[fullest].tokens) fullest = b;
    }
    if (open_[fullest].items > 0) emitted->push_back(open_[fullest]);
    open_[fullest] = StreamPack();
    best = static_cast<int>(fullest);
  }
  StreamPack& bin = open_[best];
  if (bin.items == 0) bin.first_item = next_item_;
  bin.last_item = next_item_++;
  bin.tokens += it.tokens;
  bin.image_tokens += it.image_tokens;
  bin.vit += it.vit;
  ++bin.items;
  return absl::OkStatus();
}

void SeedStreamPacker::Flush(std::vector<StreamPack>* emitted) {
  for (StreamPack& bin : open_) {
    if (bin.items > 0) emitted->push_back(bin);
    bin = StreamPack();
  }
}

PackSpread MeasurePacks(const std::vector<StreamPack>& packs) {
  PackSpread s;
  s.packs = packs.size();
  if (packs.empty()) return s;
  double img = 0, img2 = 0, tok = 0, vit = 0, vit2 = 0;
  for (const StreamPack& p : packs) {
    img += p.image_tokens;
    img2 += static_cast<double>(p.image_tokens) * p.image_tokens;
    tok += p.tokens;
    vit += p.vit;
    vit2 += p.vit * p.vit;
  }
  const double n = static_cast<double>(packs.size());
  s.image_tokens_mean = img / n;
  s.image_tokens_std =
      std::sqrt(std::max(0.0, img2 / n - s.image_tokens_mean * s.image_tokens_mean));
  s.tokens_mean = tok / n;
  const double vm = vit / n;
  s.vit_std = std::sqrt(std::max(0.0, vit2 / n - vm * vm));
  return s;
}

}  // namespace tutti::packer
