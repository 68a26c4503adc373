#include "services/packer/core/chunking.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::packer {
namespace {

// One rank's chunks as the header defines them, computed the plain way:
// positions by decreasing patches (ties by position), each into the first
// chunk it fits (an image above the limit alone), chunks by their first
// position, each listing its positions ascending, with its patches.
struct RankChunks {
  std::vector<std::vector<uint32_t>> items;
  std::vector<uint64_t> patches;
};
RankChunks Reference(const std::vector<uint32_t>& p, uint64_t max_patches) {
  std::vector<uint32_t> by(p.size());
  std::iota(by.begin(), by.end(), 0u);
  std::stable_sort(by.begin(), by.end(), [&](uint32_t a, uint32_t b) { return p[a] > p[b]; });
  std::vector<uint64_t> fill;
  std::vector<uint32_t> chunk(p.size());
  for (const uint32_t k : by) {
    size_t c = 0;
    while (c < fill.size() && fill[c] + p[k] > max_patches) ++c;
    if (c == fill.size()) fill.push_back(0);
    fill[c] += p[k] > max_patches ? max_patches + 1 : p[k];
    chunk[k] = static_cast<uint32_t>(c);
  }
  std::vector<std::vector<uint32_t>> lists(fill.size());
  for (uint32_t k = 0; k < p.size(); ++k) lists[chunk[k]].push_back(k);
  std::sort(lists.begin(), lists.end(),
            [](const auto& a, const auto& b) { return a.front() < b.front(); });
  RankChunks out;
  for (const auto& l : lists) {
    uint64_t sum = 0;
    for (const uint32_t k : l) sum += p[k];
    out.items.push_back(l);
    out.patches.push_back(sum);
  }
  return out;
}

TEST(ChunkingTest, MatchesFirstFitDecreasingOnEveryRank) {
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&](uint64_t n) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state % n;
  };
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t W = 1 + static_cast<uint32_t>(next(12));
    // Limits from a few images a chunk to all of them; patch counts from a
    // narrow band (many ties) to over 2^24 (every radix pass).
    const uint64_t max_patches = uint64_t{1} << (6 + next(20));
    const uint64_t spread = uint64_t{1} << (1 + next(26));
    StepPlanData plan;
    plan.enc_images.begin.assign(1, 0);
    std::vector<std::vector<uint32_t>> rows(W);
    std::vector<uint32_t> row_patches;
    for (uint32_t r = 0; r < W; ++r) {
      const uint32_t n = static_cast<uint32_t>(next(5) == 0 ? 0 : next(120));
      for (uint32_t k = 0; k < n; ++k) {
        rows[r].push_back(static_cast<uint32_t>(1 + next(spread)));
        row_patches.push_back(rows[r].back());
        plan.enc_images.items.push_back(static_cast<uint32_t>(plan.enc_images.items.size()));
      }
      plan.enc_images.begin.push_back(static_cast<uint32_t>(plan.enc_images.items.size()));
    }
    BuildChunks(max_patches, row_patches.data(), &plan);
    ASSERT_EQ(plan.rank_chunks.size(), W + 1u);
    for (uint32_t r = 0; r < W; ++r) {
      const RankChunks want = Reference(rows[r], max_patches);
      ASSERT_EQ(plan.rank_chunks[r + 1] - plan.rank_chunks[r], want.items.size())
          << "trial " << trial << " rank " << r;
      for (uint32_t c = 0; c < want.items.size(); ++c) {
        const uint32_t id = plan.rank_chunks[r] + c;
        const std::vector<uint32_t> got(plan.chunks.items.begin() + plan.chunks.begin[id],
                                        plan.chunks.items.begin() + plan.chunks.begin[id + 1]);
        ASSERT_EQ(got, want.items[c]) << "trial " << trial << " rank " << r << " chunk " << c;
        ASSERT_EQ(plan.chunk_patches[id], want.patches[c]);
      }
    }
  }
}

}  // namespace
}  // namespace tutti::packer
