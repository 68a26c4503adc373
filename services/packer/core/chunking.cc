#include "services/packer/core/chunking.h"

#include <algorithm>
#include <vector>

namespace tutti::packer {
namespace {

// Positions 0..n-1 of `patches` by decreasing patches, ties by position,
// into the low 32 bits of *order. Sorted as (~patches << 32 | position) up
// to kSmallSort items; above, by an LSD radix sort of the positions on
// max - patches, 8 bits a pass (stable, so ties keep their order): a rank
// holds tens of images, where comparison sorts mispredict most branches.
void SortDecreasing(const std::vector<uint32_t>& patches, std::vector<uint64_t>* order) {
  constexpr uint32_t kSmallSort = 16;
  const uint32_t n = static_cast<uint32_t>(patches.size());
  order->resize(n);
  if (n <= kSmallSort) {
    for (uint32_t k = 0; k < n; ++k) (*order)[k] = uint64_t{~patches[k]} << 32 | k;
    std::sort(order->begin(), order->end());
    return;
  }
  const uint32_t top = *std::max_element(patches.begin(), patches.end());
  thread_local std::vector<uint32_t> pos, tmp;
  pos.resize(n);
  tmp.resize(n);
  for (uint32_t k = 0; k < n; ++k) pos[k] = k;
  const uint32_t spread = top - *std::min_element(patches.begin(), patches.end());
  for (uint32_t shift = 0; shift < 32 && spread >> shift != 0; shift += 8) {
    uint32_t count[257] = {};
    for (uint32_t k = 0; k < n; ++k) ++count[((top - patches[k]) >> shift & 0xFF) + 1];
    for (uint32_t d = 0; d < 256; ++d) count[d + 1] += count[d];
    for (uint32_t k = 0; k < n; ++k) {
      const uint32_t p = pos[k];
      tmp[count[(top - patches[p]) >> shift & 0xFF]++] = p;
    }
    pos.swap(tmp);
  }
  for (uint32_t k = 0; k < n; ++k) (*order)[k] = pos[k];
}

}  // namespace

void BuildChunks(uint64_t max_patches, const uint32_t* row_patches, StepPlanData* plan) {
  const uint32_t W = plan->enc_images.rows();
  plan->chunks.begin.assign(1, 0);
  plan->chunks.items.clear();
  plan->chunks.items.reserve(plan->enc_images.items.size());
  plan->chunk_patches.clear();
  plan->rank_chunks.assign(W + 1, 0);
  thread_local std::vector<uint32_t> patches;     // position -> patches
  thread_local std::vector<uint64_t> order;       // (~patches << 32 | position): largest first
  thread_local std::vector<uint64_t> fill;        // patches per open chunk
  thread_local std::vector<uint32_t> chunk_of;    // position -> chunk
  thread_local std::vector<uint32_t> first_pos;   // chunk -> smallest position
  thread_local std::vector<uint32_t> chunk_rank;  // chunk order by first_pos
  thread_local std::vector<uint32_t> at;          // chunk -> next output slot
  for (uint32_t r = 0; r < W; ++r) {
    plan->rank_chunks[r] = static_cast<uint32_t>(plan->chunk_patches.size());
    const uint32_t n = plan->enc_images.size(r);
    if (n == 0) continue;
    const uint32_t* row = row_patches + plan->enc_images.begin[r];
    // All of the rank's images within the limit (few or small images):
    // first-fit decreasing puts them in one chunk, in position order, so
    // the sort is not needed.
    uint64_t total = 0;
    for (uint32_t k = 0; k < n; ++k) total += row[k];
    if (total <= max_patches) {
      const size_t base = plan->chunks.items.size();
      plan->chunks.items.resize(base + n);
      for (uint32_t k = 0; k < n; ++k) plan->chunks.items[base + k] = k;
      plan->chunks.begin.push_back(static_cast<uint32_t>(base + n));
      plan->chunk_patches.push_back(total);
      continue;
    }
    patches.assign(row, row + n);
    SortDecreasing(patches, &order);
    fill.clear();
    chunk_of.resize(n);
    for (const uint64_t entry : order) {
      const uint32_t pos = static_cast<uint32_t>(entry);
      const uint64_t p = patches[pos];
      uint32_t c = 0;
      while (c < fill.size() && fill[c] + p > max_patches) ++c;
      if (c == fill.size()) fill.push_back(0);
      // An image above the limit fills its chunk on its own.
      fill[c] += p > max_patches ? max_patches + 1 : p;
      chunk_of[pos] = c;
    }
    const uint32_t nc = static_cast<uint32_t>(fill.size());
    first_pos.assign(nc, UINT32_MAX);
    for (uint32_t k = 0; k < n; ++k) first_pos[chunk_of[k]] = std::min(first_pos[chunk_of[k]], k);
    chunk_rank.resize(nc);
    for (uint32_t c = 0; c < nc; ++c) chunk_rank[c] = c;
    std::sort(chunk_rank.begin(), chunk_rank.end(),
              [&](uint32_t a, uint32_t b) { return first_pos[a] < first_pos[b]; });
    // Chunks in order of their first image, each with its images by
    // position: a counting sort of the positions by chunk.
    const size_t base = plan->chunks.items.size();
    at.resize(nc);
    fill.assign(nc, 0);                        // now: patches per chunk
    std::vector<uint32_t>& count = first_pos;  // reused: images per chunk
    count.assign(nc, 0);
    for (uint32_t k = 0; k < n; ++k) {
      ++count[chunk_of[k]];
      fill[chunk_of[k]] += patches[k];
    }
    uint32_t next = static_cast<uint32_t>(base);
    for (uint32_t c : chunk_rank) {
      at[c] = next;
      next += count[c];
      plan->chunks.begin.push_back(next);
      plan->chunk_patches.push_back(fill[c]);
    }
    plan->chunks.items.resize(base + n);
    for (uint32_t k = 0; k < n; ++k) plan->chunks.items[at[chunk_of[k]]++] = k;
  }
  plan->rank_chunks[W] = static_cast<uint32_t>(plan->chunk_patches.size());
}

}  // namespace tutti::packer
