#include "tools/datagen/dataset_gen.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/file_io.h"
#include "common/media_header.h"
#include "common/tar.h"
#include "services/stager/decode/members.h"

namespace tutti::datagen {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("tutti_datagen_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// A small, fast dataset: tiny images, many of every kind of sample.
GenDatasetOptions SmallOptions(const std::string& out) {
  GenDatasetOptions o;
  o.out_dir = out;
  o.samples = 30;
  o.samples_per_shard = 12;
  o.text_fraction = 0.4;
  o.audio_fraction = 0.2;
  o.max_megapixels = 0.03;
  o.text_tokens_median = 40;
  o.threads = 2;
  o.seed = 7;
  return o;
}

std::vector<int64_t> ParseInputIds(const std::string& json) {
  const std::string prefix = "{\"input_ids\":[";
  EXPECT_EQ(json.rfind(prefix, 0), 0u) << json.substr(0, 40);
  EXPECT_EQ(json.substr(json.size() - 2), "]}");
  std::vector<int64_t> ids;
  for (absl::string_view tok : absl::StrSplit(
           absl::string_view(json).substr(prefix.size(), json.size() - prefix.size() - 2), ',')) {
    int64_t v = -1;
    EXPECT_TRUE(absl::SimpleAtoi(tok, &v)) << tok;
    ids.push_back(v);
  }
  return ids;
}

TEST(ParseFormats, AcceptsWeightsAndNames) {
  auto mix = ParseFormats("jpg:7, png:2,webp");
  ASSERT_TRUE(mix.ok()) << mix.status();
  EXPECT_THAT(mix->kinds,
              ::testing::ElementsAre(ImageKind::kJpeg, ImageKind::kPng, ImageKind::kWebp));
  EXPECT_THAT(mix->weights, ::testing::ElementsAre(7, 2, 1));
  EXPECT_TRUE(ParseFormats("jpeg").ok());
}

TEST(ParseFormats, RejectsBadSpecs) {
  EXPECT_THAT(std::string(ParseFormats("gif").status().message()),
              HasSubstr("unknown image format 'gif'"));
  EXPECT_THAT(std::string(ParseFormats("jpg:0").status().message()), HasSubstr("positive"));
  EXPECT_THAT(std::string(ParseFormats("jpg:x").status().message()), HasSubstr("positive"));
  EXPECT_THAT(std::string(ParseFormats("png,png").status().message()), HasSubstr("twice"));
  EXPECT_FALSE(ParseFormats("").ok());
}

TEST(ValidateGenOptions, NamesTheOption) {
  GenDatasetOptions o;
  EXPECT_THAT(std::string(ValidateGenOptions(o).message()), HasSubstr("--out"));
  o.out_dir = "/tmp/x";
  EXPECT_TRUE(ValidateGenOptions(o).ok());
  o.text_fraction = 1.5;
  EXPECT_THAT(std::string(ValidateGenOptions(o).message()), HasSubstr("--text-fraction"));
  o.text_fraction = 0.5;
  o.samples_per_shard = 0;
  EXPECT_THAT(std::string(ValidateGenOptions(o).message()), HasSubstr("--samples-per-shard"));
  o.samples_per_shard = 1;
  o.max_megapixels = 0;
  EXPECT_THAT(std::string(ValidateGenOptions(o).message()), HasSubstr("--max-megapixels"));
}

TEST(PlanSample, IsDeterministicAndFollowsTheMix) {
  GenDatasetOptions o;
  o.out_dir = "unused";
  auto mix = ParseFormats(o.formats);
  ASSERT_TRUE(mix.ok());
  uint64_t with_images = 0, images = 0, large = 0, over_cap = 0;
  std::map<ImageKind, int> kinds;
  std::vector<size_t> lengths, vl_lengths;  // text-only samples', VL samples'
  for (uint64_t i = 0; i < 4000; ++i) {
    const SampleSpec s = PlanSample(o, *mix, i);
    const SampleSpec again = PlanSample(o, *mix, i);
    ASSERT_EQ(s.input_ids, again.input_ids);
    ASSERT_EQ(s.images.size(), again.images.size());
    EXPECT_EQ(s.key.size(), 9u);
    for (int32_t id : s.input_ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, static_cast<int32_t>(kFirstSpecialTokenId));
    }
    (s.images.empty() ? lengths : vl_lengths).push_back(s.input_ids.size());
    with_images += !s.images.empty();
    EXPECT_LE(s.images.size(), 4u);
    for (const auto& img : s.images) {
      ++images;
      ++kinds[img.format];
      const double mp = double(img.width) * img.height / 1e6;
      large += mp > 2.0;
      over_cap += mp > 16.0;
      EXPECT_GE(img.width, 32u);
      EXPECT_LE(img.width, kMaxGeneratedSide);
      EXPECT_TRUE(img.channels == 1 || img.channels == 3 || img.channels == 4);
      if (img.format == ImageKind::kJpeg) {
        EXPECT_NE(img.channels, 4u);
      }
    }
    EXPECT_EQ(s.audio_ms, 0u);  // audio_fraction defaults to 0
  }
  // 20% of samples carry images; 10% of images are large.
  EXPECT_NEAR(with_images / 4000.0, 0.2, 0.03);
  EXPECT_NEAR(double(large) / images, 0.1, 0.04);
  EXPECT_EQ(over_cap, 0u);
  EXPECT_GT(kinds[ImageKind::kJpeg], kinds[ImageKind::kPng]);
  EXPECT_GT(kinds[ImageKind::kPng], kinds[ImageKind::kWebp]);
  // The seed workload's text lengths (common/workload.h): medians 1,000
  // and 150 tokens; 1-4 images a VL sample, 2.5 on average.
  std::sort(lengths.begin(), lengths.end());
  std::sort(vl_lengths.begin(), vl_lengths.end());
  EXPECT_NEAR(double(lengths[lengths.size() / 2]), 1000.0, 80.0);
  EXPECT_NEAR(double(vl_lengths[vl_lengths.size() / 2]), 150.0, 20.0);
  EXPECT_NEAR(double(images) / with_images, 2.5, 0.15);
}

TEST(PlanSample, MaxMegapixelsCapsEveryImage) {
  GenDatasetOptions o;
  o.out_dir = "unused";
  o.text_fraction = 0;
  o.max_megapixels = 2;
  auto mix = ParseFormats("png");
  ASSERT_TRUE(mix.ok());
  for (uint64_t i = 0; i < 500; ++i) {
    for (const auto& img : PlanSample(o, *mix, i).images) {
      EXPECT_LE(double(img.width) * img.height, 2e6);
      EXPECT_EQ(img.format, ImageKind::kPng);
    }
  }
}

TEST(RenderImage, HasStructure) {
  ImageSpec spec;
  spec.width = 320;
  spec.height = 200;
  spec.seed = 3;
  cv::Mat img;
  RenderImage(spec, &img);
  ASSERT_EQ(img.cols, 320);
  ASSERT_EQ(img.rows, 200);
  cv::Scalar mean, stddev;
  cv::meanStdDev(img, mean, stddev);
  EXPECT_GT(stddev[0] + stddev[1] + stddev[2], 15.0);  // not a flat colour
  cv::Mat again;
  RenderImage(spec, &again);
  EXPECT_EQ(cv::norm(img, again, cv::NORM_INF), 0.0);
}

TEST(GenerateDataset, WritesReadableShards) {
  TempDir dir;
  GenDatasetOptions o = SmallOptions(dir.path());
  uint64_t calls = 0;
  auto stats = GenerateDataset(o, [&](const GenProgress& p) {
    ++calls;
    EXPECT_EQ(p.samples_done, calls);
    EXPECT_EQ(p.samples_total, 30u);
  });
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(calls, 30u);
  ASSERT_EQ(stats->shards.size(), 3u);  // 12 + 12 + 6
  EXPECT_EQ(stats->samples, 30u);
  EXPECT_GT(stats->images, 0u);
  EXPECT_GT(stats->with_audio, 0u);

  auto mix = ParseFormats(o.formats);
  ASSERT_TRUE(mix.ok());
  uint64_t bytes = 0, seen_samples = 0, images = 0, audio = 0;
  std::string last_key;
  for (size_t s = 0; s < stats->shards.size(); ++s) {
    EXPECT_EQ(stats->shards[s], ShardName(s));
    auto file = OpenLocalFile(dir.path() + "/" + stats->shards[s]);
    ASSERT_TRUE(file.ok()) << file.status();
    bytes += (*file)->size();
    auto members = ListTarMembers(**file);
    ASSERT_TRUE(members.ok()) << members.status();
    for (const TarMember& m : *members) {
      auto [key, ext] = SplitWebDatasetName(m.name);
      auto data = (*file)->ReadString(m.data_offset, m.size);
      ASSERT_TRUE(data.ok());
      uint64_t index = 0;
      ASSERT_TRUE(absl::SimpleAtoi(key, &index)) << m.name;
      const SampleSpec spec = PlanSample(o, *mix, index);
      if (ext == "json") {
        ++seen_samples;
        EXPECT_GT(std::string(key), last_key);  // samples in key order, json first
        last_key = std::string(key);
        EXPECT_EQ(ParseInputIds(*data).size(), spec.input_ids.size());
        EXPECT_EQ(index / o.samples_per_shard, s);
      } else if (ext == "wav") {
        ++audio;
        auto wav = ReadWavHeader(*data);
        ASSERT_TRUE(wav.ok()) << wav.status();
        EXPECT_EQ(wav->sample_rate, 16000u);
        EXPECT_EQ(wav->channels, 1);
        EXPECT_EQ(wav->bits_per_sample, 16);
        EXPECT_EQ(wav->duration_ms, spec.audio_ms);
      } else {
        ++images;
        std::vector<std::string> parts = absl::StrSplit(ext, '.');
        ASSERT_EQ(parts.size(), 2u) << m.name;
        size_t i = 0;
        ASSERT_TRUE(absl::SimpleAtoi(parts[0], &i));
        ASSERT_LT(i, spec.images.size());
        auto header = ReadImageHeader(*data);
        ASSERT_TRUE(header.ok()) << m.name << ": " << header.status();
        EXPECT_EQ(header->kind, spec.images[i].format) << m.name;
        EXPECT_EQ(ImageKindFromExtension(parts[1]), spec.images[i].format) << m.name;
        EXPECT_EQ(header->width, spec.images[i].width);
        EXPECT_EQ(header->height, spec.images[i].height);
        cv::Mat decoded =
            cv::imdecode(std::vector<uint8_t>(data->begin(), data->end()), cv::IMREAD_UNCHANGED);
        ASSERT_FALSE(decoded.empty()) << m.name;
        EXPECT_EQ(decoded.channels(), static_cast<int>(spec.images[i].channels)) << m.name;
      }
    }
  }
  EXPECT_EQ(seen_samples, 30u);
  EXPECT_EQ(images, stats->images);
  EXPECT_EQ(audio, stats->with_audio);
  EXPECT_EQ(bytes, stats->bytes);
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().extension(), ".tar") << "left behind: " << e.path();
  }
}

std::map<std::string, std::string> ReadAll(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    auto data = ReadFileToString(e.path().string());
    EXPECT_TRUE(data.ok());
    files[e.path().filename().string()] = *data;
  }
  return files;
}

TEST(GenerateDataset, SameSeedGivesIdenticalBytesWhateverTheThreads) {
  TempDir a, b, c;
  GenDatasetOptions o = SmallOptions(a.path());
  o.threads = 1;
  ASSERT_TRUE(GenerateDataset(o).ok());
  o.out_dir = b.path();
  o.threads = 3;
  ASSERT_TRUE(GenerateDataset(o).ok());
  const auto fa = ReadAll(a.path()), fb = ReadAll(b.path());
  ASSERT_EQ(fa.size(), 3u);
  EXPECT_TRUE(fa == fb) << "shards differ between 1 and 3 threads";

  o.out_dir = c.path();
  o.seed = 8;
  ASSERT_TRUE(GenerateDataset(o).ok());
  EXPECT_NE(ReadAll(c.path()).at("shard-000000.tar"), fa.at("shard-000000.tar"));
}

TEST(GenerateDataset, RefusesNonEmptyDirectoryUnlessForced) {
  TempDir dir;
  fs::create_directories(dir.path());
  std::ofstream(dir.path() + "/notes.txt") << "keep me";
  std::ofstream(dir.path() + "/shard-000009.tar") << "stale";
  GenDatasetOptions o = SmallOptions(dir.path());
  o.samples = 5;
  auto refused = GenerateDataset(o);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("not empty"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--force"));
  EXPECT_TRUE(fs::exists(dir.path() + "/shard-000009.tar"));  // nothing touched

  o.force = true;
  auto stats = GenerateDataset(o);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_FALSE(fs::exists(dir.path() + "/shard-000009.tar"));  // stale shard replaced
  EXPECT_TRUE(fs::exists(dir.path() + "/notes.txt"));
  EXPECT_TRUE(fs::exists(dir.path() + "/shard-000000.tar"));
}

TEST(GenerateDataset, RefusesAFileAsOutput) {
  TempDir dir;
  fs::create_directories(dir.path());
  std::ofstream(dir.path() + "/file") << "x";
  GenDatasetOptions o = SmallOptions(dir.path() + "/file");
  auto status = GenerateDataset(o).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("not a directory"));
}

}  // namespace
}  // namespace tutti::datagen
