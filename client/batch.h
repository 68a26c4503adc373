// One rank's batch for one step, as the stager delivers it: arrays in a
// shared-memory segment (layout in stager.proto, ArrayDesc), mapped read-only
// and viewed without copying, plus the rank's plan and sample metadata.
//
// A Batch owns its stager lease: destroying it (or Release()) tells the
// stager the memory may be reused, then unmaps it. Views must not be used
// after that; a binding that hands the memory out (Python) keeps the mapping
// alive through segment(), but the stager may then overwrite the contents.
// Movable, not copyable; not thread-safe (use from one thread).
#ifndef TUTTI_CLIENT_BATCH_H_
#define TUTTI_CLIENT_BATCH_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/proto_fwd.h"
#include "common/shm.h"

namespace tutti {

// A typed view of one array inside the mapped segment.
struct ArrayView {
  std::string name;
  v1::DType dtype = static_cast<v1::DType>(0);  // DTYPE_UNSPECIFIED
  std::vector<uint64_t> shape;
  const void* data = nullptr;  // 64-byte aligned, inside the segment
  uint64_t offset = 0;         // from the start of the segment
  uint64_t nbytes = 0;

  uint64_t elements() const;
  // The elements as T; T must match the dtype's size (bfloat16 as uint16_t).
  template <typename T>
  absl::Span<const T> span() const {
    return absl::Span<const T>(static_cast<const T*>(data), nbytes / sizeof(T));
  }
};

class Batch {
 public:
  // Called once when the batch is released; returns whether the stager took
  // the release. Empty: nothing to tell (a segment mapped for inspection).
  using Releaser = std::function<absl::Status()>;

  // Maps desc.shm_name read-only and checks every array against the segment
  // and the contract: known dtype, nbytes = elements x dtype size, 64-byte
  // aligned, inside the segment, names unique, the well-known arrays with
  // their documented dtype and rank, pixel_values rows = the patches of
  // image_grid_thw, cu_seqlens ending at len(input_ids). DATA_LOSS naming
  // step, rank, segment and array otherwise; NOT_FOUND when the segment does
  // not exist. `copy_on_write`: map the segment privately, so that writes
  // through the views stay in this process (a binding that hands out
  // writable arrays); otherwise read-only.
  static absl::StatusOr<Batch> Map(v1::BatchDescriptor desc, Releaser release = nullptr,
                                   bool copy_on_write = false);

  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;
  ~Batch();  // releases (errors are printed to stderr; call Release() to see them)

  uint64_t step() const;
  uint32_t rank() const;
  uint64_t max_pixels() const;
  uint32_t seq_len() const;
  const v1::RankPlan& plan() const;
  const google::protobuf::RepeatedPtrField<v1::SampleInfo>& samples() const;
  const google::protobuf::RepeatedPtrField<v1::SkippedSample>& skipped() const;
  const v1::BatchDescriptor& descriptor() const;

  const std::vector<ArrayView>& arrays() const;
  // The array called `name`, or nullptr.
  const ArrayView* Find(absl::string_view name) const;

  // Well-known arrays (stager.proto); empty spans / nullptr when absent.
  const ArrayView* pixel_values() const { return Find("pixel_values"); }  // FLOAT32 or BFLOAT16
  absl::Span<const int32_t> image_grid_thw() const {
    return Int32("image_grid_thw");
  }  // 3 per image
  absl::Span<const int64_t> image_sample_ids() const { return Int64("image_sample_ids"); }
  absl::Span<const int32_t> input_ids() const { return Int32("input_ids"); }
  absl::Span<const int32_t> cu_seqlens() const { return Int32("cu_seqlens"); }
  absl::Span<const int32_t> seq_offsets() const { return Int32("seq_offsets"); }
  absl::Span<const int32_t> micro_batch_offsets() const { return Int32("micro_batch_offsets"); }
  absl::Span<const int64_t> doc_sample_ids() const { return Int64("doc_sample_ids"); }
  absl::Span<const float> audio_values() const;
  absl::Span<const int32_t> audio_lengths() const { return Int32("audio_lengths"); }
  // Images (rows of image_grid_thw) and patches (rows of pixel_values).
  uint64_t images() const;
  uint64_t patches() const;

  // Seconds Next() waited for this batch (retries included).
  double wait_seconds() const;
  void set_wait_seconds(double s);

  // The mapping; holding it keeps the memory mapped past Release().
  std::shared_ptr<const ShmSegment> segment() const;

  // Tells the stager the batch is consumed (once; later calls return OK).
  absl::Status Release();
  bool released() const;

 private:
  struct State;  // the descriptor, the mapping and the views (batch.cc)
  explicit Batch(std::unique_ptr<State> s);
  absl::Span<const int32_t> Int32(absl::string_view name) const;
  absl::Span<const int64_t> Int64(absl::string_view name) const;

  std::unique_ptr<State> s_;
};

}  // namespace tutti

#endif  // TUTTI_CLIENT_BATCH_H_
