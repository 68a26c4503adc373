#include "client/batch.h"

#include <algorithm>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/exchange_layout.h"
#include "common/dtype.h"
#include "common/log.h"
#include "common/status.h"
#include "tutti/v1/stager.pb.h"

namespace tutti {
namespace {

const Logger kLog("client.batch");

constexpr uint64_t kAlignment = 64;

// The documented dtypes and rank of the arrays stager.proto names.
struct KnownArray {
  const char* name;
  std::vector<v1::DType> dtypes;
  size_t rank;
};
const std::vector<KnownArray>& KnownArrays() {
  static const auto* known = new std::vector<KnownArray>{
      {"pixel_values", {v1::DTYPE_FLOAT32, v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT16}, 2},
      {"image_grid_thw", {v1::DTYPE_INT32}, 2},
      {"image_sample_ids", {v1::DTYPE_INT64}, 1},
      {"input_ids", {v1::DTYPE_INT32}, 1},
      {"cu_seqlens", {v1::DTYPE_INT32}, 1},
      {"seq_offsets", {v1::DTYPE_INT32}, 1},
      {"micro_batch_offsets", {v1::DTYPE_INT32}, 1},
      {"doc_sample_ids", {v1::DTYPE_INT64}, 1},
      {"loss_mask", {v1::DTYPE_UINT8}, 1},
      {"doc_image_starts", {v1::DTYPE_INT32}, 1},
      {"audio_values", {v1::DTYPE_FLOAT32}, 1},
      {"audio_lengths", {v1::DTYPE_INT32}, 1},
  };
  return *known;
}

std::string ShapeText(const std::vector<uint64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

struct Batch::State {
  v1::BatchDescriptor desc;
  std::shared_ptr<ShmSegment> segment;
  std::vector<ArrayView> arrays;
  Releaser release;
  bool released = false;
  double wait_seconds = 0;
};

Batch::Batch(std::unique_ptr<State> s) : s_(std::move(s)) {}

uint64_t Batch::step() const { return s_->desc.step(); }
uint32_t Batch::rank() const { return s_->desc.rank(); }
uint64_t Batch::max_pixels() const { return s_->desc.max_pixels(); }
uint32_t Batch::seq_len() const { return s_->desc.seq_len(); }
const v1::RankPlan& Batch::plan() const { return s_->desc.plan(); }
const google::protobuf::RepeatedPtrField<v1::SampleInfo>& Batch::samples() const {
  return s_->desc.samples();
}
const google::protobuf::RepeatedPtrField<v1::SkippedSample>& Batch::skipped() const {
  return s_->desc.skipped();
}
const v1::BatchDescriptor& Batch::descriptor() const { return s_->desc; }
const std::vector<ArrayView>& Batch::arrays() const { return s_->arrays; }
double Batch::wait_seconds() const { return s_->wait_seconds; }
void Batch::set_wait_seconds(double s) { s_->wait_seconds = s; }
std::shared_ptr<const ShmSegment> Batch::segment() const { return s_->segment; }
bool Batch::released() const { return s_->released; }

uint64_t ArrayView::elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<Batch> Batch::Map(v1::BatchDescriptor desc, Releaser release, bool copy_on_write) {
  const std::string where = absl::StrCat(ExchangeWhere(desc.step(), desc.rank()),
                                         ", batch segment '", desc.shm_name(), "'");
  auto corrupt = [&](auto&&... parts) {
    return absl::DataLossError(absl::StrCat(where, ": ", parts...,
                                            " (the stager wrote a batch this client cannot read: "
                                            "are both the same tutti version?)"));
  };
  // The batch owns the lease from here on: every failure below releases it.
  auto owned = std::make_unique<State>();
  owned->desc = std::move(desc);
  owned->release = std::move(release);
  Batch batch(std::move(owned));
  State* state = batch.s_.get();
  const v1::BatchDescriptor& d = state->desc;
  if (d.shm_name().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the descriptor names no segment"));
  }
  auto segment = copy_on_write ? ShmSegment::OpenCopyOnWrite(d.shm_name())
                               : ShmSegment::Open(d.shm_name(), /*writable=*/false);
  if (!segment.ok()) return Annotate(segment.status(), absl::StrCat(where, ": cannot map it"));
  state->segment = std::move(*segment);
  const uint64_t size = state->segment->size();
  if (d.shm_size() > size) {
    return corrupt("the descriptor says ", d.shm_size(), " bytes but the segment has ", size);
  }
  std::set<std::string> names;
  for (const v1::ArrayDesc& a : d.arrays()) {
    ArrayView v;
    v.name = a.name();
    v.dtype = a.dtype();
    v.shape.assign(a.shape().begin(), a.shape().end());
    v.offset = a.offset();
    v.nbytes = a.nbytes();
    if (!names.insert(v.name).second) return corrupt("array '", v.name, "' appears twice");
    const size_t esize = DTypeSize(v.dtype);
    if (esize == 0)
      return corrupt("array '", v.name, "' has unknown dtype ", static_cast<int>(v.dtype));
    uint64_t elements = 1;
    for (uint64_t d : v.shape) {
      if (d != 0 && elements > std::numeric_limits<uint64_t>::max() / esize / d) {
        return corrupt("array '", v.name, "' shape ", ShapeText(v.shape), " overflows");
      }
      elements *= d;
    }
    if (elements * esize != v.nbytes) {
      return corrupt("array '", v.name, "' has shape ", ShapeText(v.shape), " of ",
                     DTypeName(v.dtype), " (", elements * esize, " bytes) but nbytes ", v.nbytes);
    }
    if (v.offset % kAlignment != 0) {
      return corrupt("array '", v.name, "' starts at offset ", v.offset, ", not a multiple of 64");
    }
    if (v.offset > size || v.nbytes > size - v.offset) {
      return corrupt("array '", v.name, "' spans bytes [", v.offset, ", ", v.offset + v.nbytes,
                     ") but the segment has ", size);
    }
    for (const KnownArray& k : KnownArrays()) {
      if (v.name != k.name) continue;
      if (std::find(k.dtypes.begin(), k.dtypes.end(), v.dtype) == k.dtypes.end()) {
        return corrupt("array '", v.name, "' has dtype ", DTypeName(v.dtype),
                       ", which stager.proto does not allow for it");
      }
      if (v.shape.size() != k.rank) {
        return corrupt("array '", v.name, "' has shape ", ShapeText(v.shape), "; expected ", k.rank,
                       " dimension(s)");
      }
    }
    v.data = state->segment->data() + v.offset;
    state->arrays.push_back(std::move(v));
  }

  // Cross-array consistency.
  if (const ArrayView* grid = batch.Find("image_grid_thw")) {
    if (grid->shape[1] != 3)
      return corrupt("image_grid_thw has shape ", ShapeText(grid->shape), "; expected [images, 3]");
    uint64_t patches = 0;
    auto thw = batch.image_grid_thw();
    for (size_t i = 0; i < thw.size(); i += 3) {
      if (thw[i] < 0 || thw[i + 1] < 0 || thw[i + 2] < 0) {
        return corrupt("image_grid_thw row ", i / 3, " is negative");
      }
      patches += static_cast<uint64_t>(thw[i]) * thw[i + 1] * thw[i + 2];
    }
    const ArrayView* pixels = batch.pixel_values();
    if (pixels != nullptr && pixels->shape[0] != patches) {
      return corrupt("pixel_values has ", pixels->shape[0], " rows but image_grid_thw adds up to ",
                     patches, " patches");
    }
    if (pixels == nullptr && patches != 0) {
      return corrupt("image_grid_thw names ", patches, " patches but there is no pixel_values");
    }
  }
  const auto ids = batch.input_ids();
  const auto cu = batch.cu_seqlens();
  if (batch.Find("cu_seqlens") != nullptr) {
    if (cu.empty() || cu.front() != 0 || static_cast<uint64_t>(cu.back()) != ids.size()) {
      return corrupt("cu_seqlens must run from 0 to len(input_ids) = ", ids.size());
    }
    for (size_t i = 1; i < cu.size(); ++i) {
      if (cu[i] < cu[i - 1]) return corrupt("cu_seqlens decreases at ", i);
    }
  }
  return batch;
}

Batch::Batch(Batch&&) noexcept = default;

Batch& Batch::operator=(Batch&& other) noexcept {
  if (this != &other) {
    if (s_ != nullptr && !s_->released) {
      absl::Status s = Release();
      if (!s.ok()) kLog.Warning("releasing a batch failed", {{"error", s.message()}});
    }
    s_ = std::move(other.s_);
  }
  return *this;
}

Batch::~Batch() {
  if (s_ == nullptr || s_->released) return;
  absl::Status s = Release();
  if (!s.ok()) kLog.Warning("releasing a batch failed", {{"error", s.message()}});
}

absl::Status Batch::Release() {
  if (s_->released) return absl::OkStatus();
  s_->released = true;
  absl::Status s = s_->release ? s_->release() : absl::OkStatus();
  s_->arrays.clear();   // views end here
  s_->segment.reset();  // unmapped unless a binding still holds it
  return Annotate(s, absl::StrCat(ExchangeWhere(step(), rank()), ": releasing the batch"));
}

const ArrayView* Batch::Find(absl::string_view name) const {
  for (const ArrayView& a : s_->arrays) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

absl::Span<const int32_t> Batch::Int32(absl::string_view name) const {
  const ArrayView* a = Find(name);
  return a != nullptr && a->dtype == v1::DTYPE_INT32 ? a->span<int32_t>()
                                                     : absl::Span<const int32_t>();
}

absl::Span<const int64_t> Batch::Int64(absl::string_view name) const {
  const ArrayView* a = Find(name);
  return a != nullptr && a->dtype == v1::DTYPE_INT64 ? a->span<int64_t>()
                                                     : absl::Span<const int64_t>();
}

absl::Span<const float> Batch::audio_values() const {
  const ArrayView* a = Find("audio_values");
  return a != nullptr && a->dtype == v1::DTYPE_FLOAT32 ? a->span<float>()
                                                       : absl::Span<const float>();
}

uint64_t Batch::images() const {
  const ArrayView* a = Find("image_grid_thw");
  return a == nullptr ? 0 : a->shape[0];
}

uint64_t Batch::patches() const {
  const ArrayView* a = pixel_values();
  return a == nullptr ? 0 : a->shape[0];
}

}  // namespace tutti
