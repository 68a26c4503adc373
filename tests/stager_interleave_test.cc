// Schema-2 samples through a real stager: shards on disk, staged, read and
// decoded by StagerCore. Each image's run is where its placeholder was in
// k.json, doc_image_starts says so, loss_mask is 0 outside the trained
// spans, and each sample's source and meta come with the batch.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

#include "common/shm.h"
#include "gtest/gtest.h"
#include "services/stager/stager_core.h"
#include "services/stager/test_dataset.h"

namespace tutti::stager {
namespace {

namespace fs = std::filesystem;

TEST(StagerInterleaveTest, ImageRunsAreServedWhereTheirPlaceholdersAre) {
  const std::string root = ::testing::TempDir() + "/interleave_" + std::to_string(::getpid());
  fs::remove_all(root);
  const int kText = 12;
  testing::Dataset data = testing::WriteDataset(
      root + "/src", {.shards = 1, .samples_per_shard = 6, .text_tokens = kText, .schema2 = true});
  v1::JobInfo job = testing::MakeJob(data, 4, 2);
  job.mutable_config()->set_job_id("interleave");
  StagerOptions o;
  o.node = 1;
  o.cache_dir = root + "/cache";
  o.staging.source_dir = data.dir;
  o.decode_threads = 2;
  o.window = 1;
  auto metrics = std::make_shared<StagerMetrics>(std::make_shared<prometheus::Registry>());
  {
    StagerCore core(o, metrics, nullptr, nullptr);
    ASSERT_TRUE(core.Start(job).ok());
    ASSERT_TRUE(core.AddPlan(testing::MakePlan(data, job, 0, {2, 3}, 3), 0).ok());
    const v1::VisionConfig& v = job.config().vision();
    for (uint32_t rank : {2u, 3u}) {
      auto d = core.Acquire(0, rank, 20000);
      ASSERT_TRUE(d.ok()) << d.status();
      EXPECT_EQ(d->skipped_size(), 0);
      // Each sample's k.json source and meta (compact) are passed to the trainer.
      ASSERT_GT(d->samples_size(), 0);
      for (const auto& s : d->samples()) {
        EXPECT_EQ(s.sample_source(), "set" + std::to_string(s.sample_id() % 2));
        EXPECT_EQ(s.sample_meta(),
                  "{\"id\":" + std::to_string(s.sample_id()) + ",\"tags\":[\"a\",\"b\"]}");
      }
      std::map<std::string, v1::ArrayDesc> by;
      for (const auto& a : d->arrays()) by[a.name()] = a;
      ASSERT_EQ(by.count("loss_mask"), 1u);
      ASSERT_EQ(by.count("doc_image_starts"), 1u);
      auto seg = ShmSegment::Open(d->shm_name(), false);
      ASSERT_TRUE(seg.ok()) << seg.status();
      const char* base = (*seg)->data();
      const auto* ids = reinterpret_cast<const int32_t*>(base + by["input_ids"].offset());
      const auto* cu = reinterpret_cast<const int32_t*>(base + by["cu_seqlens"].offset());
      const auto* sids = reinterpret_cast<const int64_t*>(base + by["doc_sample_ids"].offset());
      const auto* loss = reinterpret_cast<const uint8_t*>(base + by["loss_mask"].offset());
      const auto* starts = reinterpret_cast<const int32_t*>(base + by["doc_image_starts"].offset());
      const uint64_t docs = by["doc_sample_ids"].shape(0);
      ASSERT_EQ(docs, 3u);
      ASSERT_EQ(by["doc_image_starts"].shape(0), docs);
      for (uint64_t k = 0; k < docs; ++k) {
        const int32_t* doc = ids + cu[k];
        const int32_t len = cu[k + 1] - cu[k];
        const int32_t n = len - kText - 2;  // the image's LLM tokens
        const int32_t sid = static_cast<int32_t>(sids[k]);
        SCOPED_TRACE(::testing::Message() << "rank " << rank << " sample " << sid);
        // k.json: ids 1000*sid + 0..5, the placeholder, 1000*sid + 6..11.
        for (int t = 0; t < kText / 2; ++t) ASSERT_EQ(doc[t], 1000 * sid + t) << t;
        ASSERT_EQ(doc[kText / 2], static_cast<int32_t>(v.vision_start_id()));
        for (int t = 0; t < n; ++t)
          ASSERT_EQ(doc[kText / 2 + 1 + t], static_cast<int32_t>(v.image_pad_id()));
        ASSERT_EQ(doc[kText / 2 + 1 + n], static_cast<int32_t>(v.vision_end_id()));
        for (int t = kText / 2; t < kText; ++t) ASSERT_EQ(doc[t + n + 2], 1000 * sid + t) << t;
        EXPECT_EQ(starts[k], kText / 2 + 1);
        // Trained: the text after the image.
        for (int32_t t = 0; t < len; ++t) {
          EXPECT_EQ(loss[cu[k] + t], t >= kText / 2 + n + 2 ? 1 : 0) << t;
        }
      }
      ASSERT_TRUE(core.Release(0, rank).ok());
    }
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace tutti::stager
