// A scratch 8-bit BGR image over bytes that only ever grow: a decode worker
// keeps one per stage (decoded image, the resize's rows and strips), so
// images of varying sizes reuse the same pages instead of mapping fresh,
// zeroed ones from the kernel for every image. Not thread-safe; keep one per
// thread.
#ifndef TUTTI_SERVICES_STAGER_DECODE_IMAGE_BUFFER_H_
#define TUTTI_SERVICES_STAGER_DECODE_IMAGE_BUFFER_H_

#include <algorithm>
#include <cstdint>
#include <memory>

#include <opencv2/core.hpp>

namespace tutti::stager {

class ImageBuffer {
 public:
  // A rows x cols CV_8UC3 image over the buffer (its contents undefined),
  // valid until the next Allocate. Throws std::bad_alloc when memory runs out.
  cv::Mat Allocate(int rows, int cols) {
    const size_t need = static_cast<size_t>(rows) * cols * 3;
    if (need > capacity_) {
      // Grow by half again, so a slowly growing sequence reallocates rarely.
      const size_t cap = std::max(need, capacity_ + capacity_ / 2);
      bytes_.reset(new uint8_t[cap]);
      capacity_ = cap;
    }
    image_ = cv::Mat(rows, cols, CV_8UC3, bytes_.get());
    return image_;
  }
  // The image of the last Allocate.
  const cv::Mat& image() const { return image_; }

 private:
  std::unique_ptr<uint8_t[]> bytes_;
  size_t capacity_ = 0;
  cv::Mat image_;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_DECODE_IMAGE_BUFFER_H_
