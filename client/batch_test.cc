#include "client/batch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "client/test_segment.h"
#include "common/dtype.h"

namespace tutti {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::TestSegment;

constexpr uint64_t kRow = 3 * 2 * 14 * 14;  // values per patch

// Two images, (1,2,2) and (1,2,4): 12 patches. Two documents in one sequence.
TestSegment& StandardBatch(TestSegment& seg, v1::DType pixel_dtype = v1::DTYPE_FLOAT32) {
  const uint64_t patches = 12;
  if (pixel_dtype == v1::DTYPE_BFLOAT16) {
    std::vector<uint16_t> px(patches * kRow);
    for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint16_t>(i);
    seg.Add("pixel_values", pixel_dtype, {patches, kRow}, px);
  } else {
    std::vector<float> px(patches * kRow);
    for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<float>(i) * 0.5f;
    seg.Add("pixel_values", pixel_dtype, {patches, kRow}, px);
  }
  seg.Add("image_grid_thw", v1::DTYPE_INT32, {2, 3}, std::vector<int32_t>{1, 2, 2, 1, 2, 4})
      .Add("image_sample_ids", v1::DTYPE_INT64, {2}, std::vector<int64_t>{41, 42})
      .Add("input_ids", v1::DTYPE_INT32, {7},
           std::vector<int32_t>{151652, 151655, 151653, 9, 8, 7, 6})
      .Add("cu_seqlens", v1::DTYPE_INT32, {3}, std::vector<int32_t>{0, 5, 7})
      .Add("seq_offsets", v1::DTYPE_INT32, {2}, std::vector<int32_t>{0, 7})
      .Add("micro_batch_offsets", v1::DTYPE_INT32, {2}, std::vector<int32_t>{0, 1})
      .Add("doc_sample_ids", v1::DTYPE_INT64, {2}, std::vector<int64_t>{41, 43});
  return seg;
}

// The permissions of the mapping that holds `p`, from /proc/self/maps.
std::string MappingPerms(const void* p) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms;
    in >> range >> perms;
    const auto dash = range.find('-');
    const uintptr_t lo = std::stoull(range.substr(0, dash), nullptr, 16);
    const uintptr_t hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (addr >= lo && addr < hi) return perms;
  }
  return "";
}

TEST(Batch, MapsEveryArrayReadOnlyWithoutCopying) {
  TestSegment seg;
  v1::BatchDescriptor desc = StandardBatch(seg).Write(5, 2);
  auto batch = Batch::Map(desc);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->step(), 5u);
  EXPECT_EQ(batch->rank(), 2u);
  EXPECT_EQ(batch->seq_len(), 4096u);
  EXPECT_EQ(batch->max_pixels(), 1003520u);
  ASSERT_EQ(batch->arrays().size(), 8u);

  const ArrayView* px = batch->pixel_values();
  ASSERT_NE(px, nullptr);
  EXPECT_EQ(px->dtype, v1::DTYPE_FLOAT32);
  EXPECT_THAT(px->shape, ElementsAre(12, kRow));
  EXPECT_EQ(px->nbytes, 12 * kRow * 4);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(px->data) % 64, 0u);
  EXPECT_EQ(px->span<float>()[3], 1.5f);
  EXPECT_EQ(batch->images(), 2u);
  EXPECT_EQ(batch->patches(), 12u);
  EXPECT_THAT(batch->image_grid_thw(), ElementsAre(1, 2, 2, 1, 2, 4));
  EXPECT_THAT(batch->image_sample_ids(), ElementsAre(41, 42));
  EXPECT_THAT(batch->input_ids(), ElementsAre(151652, 151655, 151653, 9, 8, 7, 6));
  EXPECT_THAT(batch->cu_seqlens(), ElementsAre(0, 5, 7));
  EXPECT_THAT(batch->seq_offsets(), ElementsAre(0, 7));
  EXPECT_THAT(batch->micro_batch_offsets(), ElementsAre(0, 1));
  EXPECT_THAT(batch->doc_sample_ids(), ElementsAre(41, 43));
  EXPECT_TRUE(batch->audio_values().empty());
  EXPECT_EQ(batch->Find("nothing"), nullptr);

  // Zero copy: the views point into this process's mapping of the segment,
  // a different mapping from the writer's, and see the writer's later writes.
  const char* base = batch->segment()->data();
  EXPECT_EQ(static_cast<const char*>(px->data), base + px->offset);
  EXPECT_NE(base, seg.segment()->data());
  reinterpret_cast<float*>(seg.segment()->data() + px->offset)[3] = -7.0f;
  EXPECT_EQ(px->span<float>()[3], -7.0f);
  // ... and the client's mapping is read-only and shared.
  EXPECT_EQ(MappingPerms(px->data).substr(0, 3), "r--");
  EXPECT_EQ(MappingPerms(px->data)[3], 's');
}

TEST(Batch, Bfloat16PixelsAreViewedAsUint16) {
  TestSegment seg;
  auto batch = Batch::Map(StandardBatch(seg, v1::DTYPE_BFLOAT16).Write(1, 0));
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->pixel_values()->dtype, v1::DTYPE_BFLOAT16);
  EXPECT_EQ(batch->pixel_values()->nbytes, 12 * kRow * 2);
  EXPECT_EQ(batch->pixel_values()->span<uint16_t>()[9], 9);
  EXPECT_EQ(DTypeName(v1::DTYPE_BFLOAT16), "bfloat16");
  EXPECT_EQ(DTypeSize(v1::DTYPE_BFLOAT16), 2u);
}

TEST(Batch, ReleasesOnceOnDestructionAndAfterMoves) {
  TestSegment seg;
  const v1::BatchDescriptor desc = StandardBatch(seg).Write(3, 1);
  int releases = 0;
  {
    auto batch = Batch::Map(desc, [&] {
      ++releases;
      return absl::OkStatus();
    });
    ASSERT_TRUE(batch.ok());
    Batch moved = std::move(*batch);
    Batch again = std::move(moved);
    EXPECT_EQ(again.step(), 3u);
    EXPECT_EQ(releases, 0);
  }
  EXPECT_EQ(releases, 1);

  auto batch = Batch::Map(desc, [&] {
    ++releases;
    return absl::UnavailableError("stager gone");
  });
  ASSERT_TRUE(batch.ok());
  std::shared_ptr<const ShmSegment> keep = batch->segment();
  absl::Status s = batch->Release();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("step 3, rank 1: releasing the batch"));
  EXPECT_TRUE(batch->released());
  EXPECT_TRUE(batch->arrays().empty());
  EXPECT_TRUE(batch->Release().ok());  // once only
  EXPECT_EQ(releases, 2);
  EXPECT_NE(keep->data(), nullptr);  // still mapped for whoever holds it
}

// Maps a descriptor after `mutate`; returns the error (and checks the lease
// was handed back).
absl::Status MapBroken(const std::function<void(v1::BatchDescriptor&)>& mutate) {
  TestSegment seg;
  v1::BatchDescriptor desc = StandardBatch(seg).Write(5, 2);
  mutate(desc);
  int releases = 0;
  absl::Status s = Batch::Map(desc, [&] {
                     ++releases;
                     return absl::OkStatus();
                   }).status();
  EXPECT_EQ(releases, 1) << "a refused batch must still be released";
  return s;
}

v1::ArrayDesc* Array(v1::BatchDescriptor& d, const std::string& name) {
  for (auto& a : *d.mutable_arrays()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

TEST(Batch, RefusesArraysOutsideTheSegment) {
  absl::Status s = MapBroken([](auto& d) { Array(d, "input_ids")->set_offset(d.shm_size()); });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("step 5, rank 2"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("array 'input_ids' spans bytes"));
}

TEST(Batch, RefusesInconsistentArrays) {
  struct Case {
    std::function<void(v1::BatchDescriptor&)> mutate;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {[](auto& d) { Array(d, "input_ids")->set_nbytes(12); }, "nbytes 12"},
      {[](auto& d) { Array(d, "input_ids")->set_offset(Array(d, "input_ids")->offset() + 4); },
       "not a multiple of 64"},
      {[](auto& d) { Array(d, "input_ids")->set_dtype(static_cast<v1::DType>(99)); },
       "unknown dtype"},
      {[](auto& d) { Array(d, "input_ids")->set_dtype(v1::DTYPE_FLOAT32); },
       "dtype float32, which stager.proto does not allow"},
      {[](auto& d) { *d.add_arrays() = *Array(d, "seq_offsets"); }, "appears twice"},
      {[](auto& d) {
         auto* a = Array(d, "input_ids");
         a->clear_shape();
         a->add_shape(1);
         a->add_shape(7);
       },
       "expected 1 dimension"},
      {[](auto& d) {
         auto* a = Array(d, "pixel_values");
         a->set_shape(0, 11);
         a->set_nbytes(11 * kRow * 4);
       },
       "pixel_values has 11 rows but image_grid_thw adds up to 12"},
      {[](auto& d) {
         auto* a = Array(d, "cu_seqlens");
         a->set_shape(0, 2);
         a->set_nbytes(8);
       },
       "cu_seqlens must run from 0 to len(input_ids) = 7"},
      {[](auto& d) { d.set_shm_size(d.shm_size() + 4096); }, "the segment has"},
  };
  for (const Case& c : cases) {
    absl::Status s = MapBroken(c.mutate);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << c.expect << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.expect));
  }
}

TEST(Batch, MissingSegmentIsNotFound) {
  absl::Status s = MapBroken([](auto& d) { d.set_shm_name("/tutti-test-no-such-segment"); });
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("/tutti-test-no-such-segment"));
  s = MapBroken([](auto& d) { d.clear_shm_name(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST(Batch, TextOnlyBatchHasNoPixels) {
  TestSegment seg;
  seg.Add("input_ids", v1::DTYPE_INT32, {3}, std::vector<int32_t>{1, 2, 3})
      .Add("cu_seqlens", v1::DTYPE_INT32, {2}, std::vector<int32_t>{0, 3});
  auto batch = Batch::Map(seg.Write(0, 0));
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->pixel_values(), nullptr);
  EXPECT_EQ(batch->images(), 0u);
  EXPECT_EQ(batch->patches(), 0u);
  EXPECT_TRUE(batch->image_grid_thw().empty());
}

}  // namespace
}  // namespace tutti
