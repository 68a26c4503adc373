#include "services/packer/core/chunking.h"

#include <algorithm>
#include <vector>

namespace tutti::packer {

void BuildChunks(uint64_t max_patches, StepPlanData* plan) {
  const uint32_t W = plan->enc_images.rows();
  plan->chunks.begin.assign(1, 0);
  plan->chunks.items.clear();
  plan->chunk_patches.clear();
  plan->rank_chunks.assign(W + 1, 0);
  thread_local std::vector<std::pair<uint32_t, uint32_t>> order;  // (patches, position)
  thread_local std::vector<uint64_t> fill;                        // patches per open chunk
  thread_local std::vector<uint32_t> chunk_of;                    // position -> chunk
  thread_local std::vector<uint32_t> first_pos;                   // chunk -> smallest position
  thread_local std::vector<uint32_t> chunk_rank;                  // chunk order by first_pos
  for (uint32_t r = 0; r < W; ++r) {
    plan->rank_chunks[r] = static_cast<uint32_t>(plan->chunk_patches.size());
    const uint32_t n = plan->enc_images.size(r);
    if (n == 0) continue;
    const uint32_t* imgs = plan->enc_images.row(r);
    order.clear();
    for (uint32_t k = 0; k < n; ++k) order.emplace_back(plan->images[imgs[k]].patches, k);
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    fill.clear();
    chunk_of.assign(n, 0);
    for (const auto& [patches, pos] : order) {
      uint32_t c = 0;
      while (c < fill.size() && fill[c] + patches > max_patches) ++c;
      if (c == fill.size()) fill.push_back(0);
      // An image above the limit fills its chunk on its own.
      fill[c] += patches > max_patches ? max_patches + 1 : patches;
      chunk_of[pos] = c;
    }
    const uint32_t nc = static_cast<uint32_t>(fill.size());
    first_pos.assign(nc, UINT32_MAX);
    for (uint32_t k = 0; k < n; ++k) first_pos[chunk_of[k]] = std::min(first_pos[chunk_of[k]], k);
    chunk_rank.resize(nc);
    for (uint32_t c = 0; c < nc; ++c) chunk_rank[c] = c;
    std::sort(chunk_rank.begin(), chunk_rank.end(),
              [&](uint32_t a, uint32_t b) { return first_pos[a] < first_pos[b]; });
    for (uint32_t c : chunk_rank) {
      uint64_t patches = 0;
      for (uint32_t k = 0; k < n; ++k) {
        if (chunk_of[k] != c) continue;
        plan->chunks.items.push_back(k);
        patches += plan->images[imgs[k]].patches;
      }
      plan->chunks.begin.push_back(static_cast<uint32_t>(plan->chunks.items.size()));
      plan->chunk_patches.push_back(patches);
    }
  }
  plan->rank_chunks[W] = static_cast<uint32_t>(plan->chunk_patches.size());
}

}  // namespace tutti::packer
