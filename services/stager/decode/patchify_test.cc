#include "services/stager/decode/patchify.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::stager {
namespace {

TEST(PatchifyTest, SimdAndPortableLoopsGiveTheSameValues) {
  std::mt19937 rng(3);
  // Patch 7 (planes of 49 values) and an output 4 bytes off 16-byte
  // alignment store without the aligned streaming copy.
  for (auto [patch, merge, temporal] :
       {std::array{14u, 2u, 2u}, {16u, 2u, 1u}, {14u, 1u, 2u}, {8u, 2u, 2u}, {7u, 2u, 2u}}) {
    const int factor = static_cast<int>(patch * merge);
    for (auto [gy, gx] : {std::pair{1, 1}, {3, 5}, {4, 2}}) {
      cv::Mat img(gy * factor, gx * factor, CV_8UC3);
      for (int y = 0; y < img.rows; ++y) {
        for (int i = 0; i < 3 * img.cols; ++i) img.ptr<uint8_t>(y)[i] = static_cast<uint8_t>(rng());
      }
      // CLIP's normalisation (the default), ImageNet's and 0.5/0.5: the
      // SIMD loop divides by multiplying when that is exact for every value.
      for (auto [bf16, norm] :
           {std::pair{false, 0}, {true, 0}, {false, 1}, {true, 2}, {false, 2}}) {
        PatchifyParams p;
        if (norm == 1) {
          const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
          std::copy(mean, mean + 3, p.mean);
          std::copy(std, std + 3, p.std);
        } else if (norm == 2) {
          std::fill(p.mean, p.mean + 3, 0.5f);
          std::fill(p.std, p.std + 3, 0.5f);
        }
        p.patch = patch;
        p.merge = merge;
        p.temporal = temporal;
        p.bf16 = bf16;
        const size_t n = p.ImageBytes(img.rows, img.cols);
        std::vector<char> fast(n + 4), slow(n);
        Patchify(img, p, slow.data(), false);
        for (size_t offset : {0, 4}) {
          Patchify(img, p, fast.data() + offset, true);
          EXPECT_EQ(std::memcmp(fast.data() + offset, slow.data(), n), 0)
              << "patch " << patch << " " << img.cols << "x" << img.rows
              << (bf16 ? " bf16" : " f32") << " normalisation " << norm << " offset " << offset;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tutti::stager
