// Schema-2 samples through a real stager: shards on disk, staged, read and
// decoded by StagerCore. Each image's run is where its placeholder was in
// k.json, doc_image_starts says so, loss_mask is 0 outside the trained
// spans, and each sample's source and meta come with the batch.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <opencv2/imgcodecs.hpp>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_io.h"
#include "common/shm.h"
#include "common/tar.h"
#include "gtest/gtest.h"
#include "services/packer/core/job.h"
#include "services/packer/core/planner.h"
#include "services/packer/index/index_builder.h"
#include "services/packer/plan_proto.h"
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

// Conversations from shards on disk through tutti index, the packer's
// planner and a real stager: each k.json holds 10 text ids, an image
// placeholder (the second user turn), 20 ids, a second placeholder (the
// third turn) and 10 ids; each image's run is 37 tokens, the whole 114.
// With seq_len 80, "truncate" keeps 10 + 37 + 20 = 67 tokens: the first
// image, served where its placeholder was; the second is not planned and
// never decoded. "split" makes that the first piece and the second image's
// run with the last 10 ids the second.
TEST(StagerInterleaveTest, PackerShapedConversationsServeTheirPartsInOrder) {
  for (const std::string policy : {"truncate", "split"}) {
    SCOPED_TRACE(policy);
    const bool truncate = policy == "truncate";
    const std::string root =
        ::testing::TempDir() + "/interleave_" + policy + "_" + std::to_string(::getpid());
    fs::remove_all(root);
    fs::create_directories(root + "/src/train");
    constexpr int kSamples = 8, kPad = 151655;
    TarWriter tar;
    for (int id = 0; id < kSamples; ++id) {
      const std::string key = absl::StrFormat("%06d", id);
      std::string json = "{\"schema\": 2, \"input_ids\": [";
      int t = 0;
      for (int i = 0; i < 42; ++i) {
        const bool ph = i == 10 || i == 31;
        absl::StrAppend(&json, i ? ", " : "", ph ? kPad : 1000 * id + t++);
      }
      // Trained: the assistant's answer after the first image (ids 11..30).
      json += "], \"trained\": [[11, 31]]}";
      tar.Add(key + ".json", json);
      for (int k = 0; k < 2; ++k) {
        cv::Mat img(150, 200, CV_8UC3, cv::Scalar(40 * k + id, 90, 160));
        std::vector<uchar> enc;
        cv::imencode(".jpg", img, enc);
        tar.Add(absl::StrCat(key, ".", k, ".jpg"), std::string(enc.begin(), enc.end()));
      }
    }
    ASSERT_TRUE(WriteFileAtomically(root + "/src/train/shard-00000.tar", tar.Finish()).ok());
    packer::IndexBuildOptions io;
    io.source_dir = root + "/src";
    io.image_placeholder_id = kPad;
    io.threads = 1;
    auto bytes = packer::BuildIndex(io, nullptr, nullptr);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto index = packer::Index::FromString(*bytes, "conversations.idx");
    ASSERT_TRUE(index.ok()) << index.status();
    ASSERT_EQ((*index)->num_samples(), static_cast<uint32_t>(kSamples));
    ASSERT_TRUE((*index)->has_media_positions());

    testing::Dataset none;
    v1::JobConfig config = testing::MakeJob(none, 2, 2).config();
    config.set_job_id("interleave-truncate");
    config.mutable_batch()->set_text_samples_per_step(0);
    config.mutable_batch()->set_vl_samples_per_step(truncate ? 2 : 1);
    config.mutable_curriculum(0)->set_seq_len(80);
    config.mutable_overflow()->set_long_documents(policy);
    auto job = packer::Job::Create(config, *index);
    ASSERT_TRUE(job.ok()) << job.status();
    packer::Planner planner(*job);
    packer::StepPlanData d;
    ASSERT_TRUE(planner.Plan(0, &d).ok());
    v1::StepPlan plan;
    ASSERT_TRUE(packer::BuildStepPlan(**job, d, {}, &plan).ok());
    v1::JobInfo info;
    packer::BuildJobInfo(**job, &info);
    // What the plan encodes: image 0 of each truncated conversation, never
    // image 1; both images of the split one.
    std::multiset<std::pair<uint64_t, uint32_t>> encoded;
    for (const auto& rp : plan.ranks()) {
      for (const auto& ph : rp.encoders()) {
        for (const auto& im : ph.images()) encoded.emplace(im.sample_id(), im.image_index());
      }
    }
    ASSERT_EQ(encoded.size(), 2u);
    for (const auto& [sample, image] : encoded) {
      if (truncate) EXPECT_EQ(image, 0u) << sample;
    }
    if (!truncate) EXPECT_EQ(encoded.begin()->first, encoded.rbegin()->first);

    StagerOptions o;
    o.node = 0;
    o.cache_dir = root + "/cache";
    o.staging.source_dir = root + "/src";
    o.decode_threads = 2;
    o.window = 1;
    auto metrics = std::make_shared<StagerMetrics>(std::make_shared<prometheus::Registry>());
    {
      StagerCore core(o, metrics, nullptr, nullptr);
      ASSERT_TRUE(core.Start(info).ok());
      ASSERT_TRUE(core.AddPlan(plan, 0).ok());
      const v1::VisionConfig& v = config.vision();
      uint32_t docs_seen = 0;
      for (uint32_t rank : {0u, 1u}) {
        auto b = core.Acquire(0, rank, 20000);
        ASSERT_TRUE(b.ok()) << b.status();
        EXPECT_EQ(b->skipped_size(), 0);
        std::map<std::string, v1::ArrayDesc> by;
        for (const auto& a : b->arrays()) by[a.name()] = a;
        auto seg = ShmSegment::Open(b->shm_name(), false);
        ASSERT_TRUE(seg.ok()) << seg.status();
        const char* base = (*seg)->data();
        const auto* ids = reinterpret_cast<const int32_t*>(base + by["input_ids"].offset());
        const auto* cu = reinterpret_cast<const int32_t*>(base + by["cu_seqlens"].offset());
        const auto* sids = reinterpret_cast<const int64_t*>(base + by["doc_sample_ids"].offset());
        const auto* loss = reinterpret_cast<const uint8_t*>(base + by["loss_mask"].offset());
        const auto* starts =
            reinterpret_cast<const int32_t*>(base + by["doc_image_starts"].offset());
        const uint64_t docs = by["doc_sample_ids"].shape(0);
        // Served images = planned images = one per document.
        EXPECT_EQ(by["image_grid_thw"].shape(0), docs);
        ASSERT_EQ(by["doc_image_starts"].shape(0), docs);
        for (uint64_t k = 0; k < docs; ++k) {
          ++docs_seen;
          const int32_t* doc = ids + cu[k];
          const int32_t sid = static_cast<int32_t>(sids[k]);
          SCOPED_TRACE(::testing::Message() << "rank " << rank << " sample " << sid);
          const int32_t len = cu[k + 1] - cu[k];
          std::vector<int32_t> want;
          std::vector<uint8_t> want_loss;
          auto text = [&](int from, int to, bool trained) {
            for (int t = from; t < to; ++t) want.push_back(1000 * sid + t);
            want_loss.insert(want_loss.end(), to - from, trained ? 1 : 0);
          };
          auto run = [&] {
            want.push_back(static_cast<int32_t>(v.vision_start_id()));
            want.insert(want.end(), 35, static_cast<int32_t>(v.image_pad_id()));
            want.push_back(static_cast<int32_t>(v.vision_end_id()));
            want_loss.insert(want_loss.end(), 37, 0);
          };
          if (len == 67) {  // the prefix (the truncated document, or the first piece)
            text(0, 10, false);
            run();
            text(10, 30, true);
            EXPECT_EQ(starts[k], 11);
          } else {  // the second piece
            ASSERT_FALSE(truncate);
            ASSERT_EQ(len, 47);
            run();
            text(30, 40, false);
            EXPECT_EQ(starts[k], 1);
          }
          EXPECT_EQ(std::vector<int32_t>(doc, doc + len), want);
          EXPECT_EQ(std::vector<uint8_t>(loss + cu[k], loss + cu[k] + len), want_loss);
        }
        ASSERT_TRUE(core.Release(0, rank).ok());
      }
      EXPECT_EQ(docs_seen, 2u);
    }
    // The images planned, each decoded once: the truncated conversations'
    // second images never.
    EXPECT_EQ(metrics->decoded_images.Value(), 2.0);
    fs::remove_all(root);
  }
}

}  // namespace
}  // namespace tutti::stager
