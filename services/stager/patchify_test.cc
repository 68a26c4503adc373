#include "services/stager/patchify.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::stager {
namespace {

TEST(PatchifyTest, SimdAndPortableLoopsGiveTheSameValues) {
  std::mt19937 rng(3);
  for (auto [patch, merge, temporal] : {std::array{14u, 2u, 2u}, {16u, 2u, 1u}, {14u, 1u, 2u}, {8u, 2u, 2u}}) {
    const int factor = static_cast<int>(patch * merge);
    for (auto [gy, gx] : {std::pair{1, 1}, {3, 5}, {4, 2}}) {
      cv::Mat img(gy * factor, gx * factor, CV_8UC3);
      for (int y = 0; y < img.rows; ++y) {
        for (int i = 0; i < 3 * img.cols; ++i) img.ptr<uint8_t>(y)[i] = static_cast<uint8_t>(rng());
      }
      for (bool bf16 : {false, true}) {
        PatchifyParams p;
        p.patch = patch;
        p.merge = merge;
        p.temporal = temporal;
        p.bf16 = bf16;
        const size_t n = p.ImageBytes(img.rows, img.cols);
        std::vector<char> fast(n), slow(n);
        Patchify(img, p, fast.data(), true);
        Patchify(img, p, slow.data(), false);
        EXPECT_EQ(std::memcmp(fast.data(), slow.data(), n), 0)
            << "patch " << patch << " " << img.cols << "x" << img.rows << (bf16 ? " bf16" : " f32");
      }
    }
  }
}

}  // namespace
}  // namespace tutti::stager
