// Tests only: writes a batch into a real shared-memory segment laid out as
// stager.proto describes (arrays in order, each 64-byte aligned) and returns
// its descriptor, as the stager would.
#ifndef TUTTI_CLIENT_TEST_SEGMENT_H_
#define TUTTI_CLIENT_TEST_SEGMENT_H_

#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/shm.h"
#include "tutti/v1/stager.pb.h"

namespace tutti::testing {

class TestSegment {
 public:
  template <typename T>
  TestSegment& Add(const std::string& name, v1::DType dtype, std::vector<uint64_t> shape,
                   const std::vector<T>& values) {
    Pending p;
    p.desc.set_name(name);
    p.desc.set_dtype(dtype);
    for (uint64_t d : shape) p.desc.add_shape(d);
    p.bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
    p.desc.set_nbytes(p.bytes.size());
    pending_.push_back(std::move(p));
    return *this;
  }

  // Creates the segment (a unique name per call) and the descriptor for
  // (step, rank). The segment is unlinked when this object is destroyed.
  v1::BatchDescriptor Write(uint64_t step, uint32_t rank) {
    uint64_t off = 0;
    for (auto& p : pending_) {
      p.desc.set_offset(off);
      off = (off + p.bytes.size() + 63) / 64 * 64;
    }
    name_ = "/tutti-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++);
    auto seg = ShmSegment::Create(name_, off == 0 ? 64 : off);
    if (!seg.ok()) return {};
    segment_ = std::move(*seg);
    v1::BatchDescriptor d;
    d.set_step(step);
    d.set_rank(rank);
    d.set_shm_name(name_);
    d.set_shm_size(segment_->size());
    d.set_max_pixels(1003520);
    d.set_seq_len(4096);
    d.mutable_plan()->set_rank(rank);
    for (auto& p : pending_) {
      std::memcpy(segment_->data() + p.desc.offset(), p.bytes.data(), p.bytes.size());
      *d.add_arrays() = p.desc;
    }
    return d;
  }

  // The writer's own (read-write) mapping.
  ShmSegment* segment() const { return segment_.get(); }

  ~TestSegment() {
    if (!name_.empty()) ShmSegment::Unlink(name_);
  }

 private:
  struct Pending {
    v1::ArrayDesc desc;
    std::string bytes;
  };
  static inline int counter_ = 0;
  std::vector<Pending> pending_;
  std::string name_;
  std::unique_ptr<ShmSegment> segment_;
};

}  // namespace tutti::testing

#endif  // TUTTI_CLIENT_TEST_SEGMENT_H_
