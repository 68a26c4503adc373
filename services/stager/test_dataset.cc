#include "services/stager/test_dataset.h"

#include <cmath>
#include <filesystem>
#include <map>

#include <opencv2/imgcodecs.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "common/job_config.h"
#include "common/media_header.h"
#include "common/smart_resize.h"
#include "common/tar.h"

namespace tutti::stager::testing {

int16_t TestPcm(uint64_t n, uint32_t rate) {
  return static_cast<int16_t>(std::lround(8000.0 * std::sin(2 * M_PI * 440.0 * n / rate)));
}

namespace {

std::string Wav(uint32_t ms, uint32_t rate) {
  const uint32_t frames = static_cast<uint32_t>(uint64_t{ms} * rate / 1000);
  std::string out;
  auto u32 = [&](uint32_t v) { for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i))); };
  auto u16 = [&](uint16_t v) { for (int i = 0; i < 2; ++i) out.push_back(static_cast<char>(v >> (8 * i))); };
  out += "RIFF";
  u32(36 + frames * 2);
  out += "WAVEfmt ";
  u32(16);
  u16(1);  // PCM
  u16(1);  // mono
  u32(rate);
  u32(rate * 2);
  u16(2);
  u16(16);
  out += "data";
  u32(frames * 2);
  for (uint32_t n = 0; n < frames; ++n) u16(static_cast<uint16_t>(TestPcm(n, rate)));
  return out;
}

uint32_t AudioTokens(uint32_t ms, const v1::AudioConfig& a) {
  const uint32_t frames = (ms + 9) / 10;
  const uint32_t fpt = std::max(1u, a.frames_per_token());
  return (frames + fpt - 1) / fpt;
}

}  // namespace

Dataset WriteDataset(const std::string& dir, const DatasetSpec& spec) {
  std::filesystem::create_directories(dir);
  Dataset d;
  d.dir = dir;
  int id = 0;
  for (int s = 0; s < spec.shards; ++s) {
    TarWriter tar;
    std::vector<v1::SampleInfo> infos;
    for (int k = 0; k < spec.samples_per_shard; ++k, ++id) {
      const std::string key = absl::StrFormat("%06d", id);
      cv::Mat img(spec.height, spec.width, CV_8UC3);
      for (int y = 0; y < spec.height; ++y) {
        for (int x = 0; x < spec.width; ++x) {
          img.at<cv::Vec3b>(y, x) = cv::Vec3b((x + id * 13) & 255, (y * 3) & 255, (x ^ y) & 255);
        }
      }
      std::vector<uchar> enc;
      cv::imencode(spec.ext, img, enc);
      const std::string image(enc.begin(), enc.end());
      std::string json = spec.schema2 ? "{\"schema\": 2, \"input_ids\": [" : "{\"input_ids\": [";
      for (int t = 0; t < spec.text_tokens; ++t) {
        if (spec.schema2 && t == spec.text_tokens / 2) absl::StrAppend(&json, ", 151655");
        absl::StrAppend(&json, t ? ", " : "", 1000 * id + t);
      }
      json += "]";
      if (spec.schema2) {
        absl::StrAppend(&json, ", \"trained\": [[", spec.text_tokens / 2 + 1, ", ",
                        spec.text_tokens + 1, "]]");
        absl::StrAppend(&json, ", \"source\": \"set", id % 2, "\", \"meta\": {\"id\": ", id,
                        ", \"tags\": [\"a\", \"b\"]}");
      }
      json += "}";
      v1::SampleInfo info;
      info.set_sample_id(id);
      info.set_shard(s);
      info.set_key(key);
      info.set_modality(v1::MODALITY_VL);
      const std::string img_name = key + spec.ext;
      const std::string json_name = key + ".json";
      // Data offsets follow the 512-byte tar header of each member.
      v1::MemberRef* im = info.add_images();
      im->set_name(img_name);
      im->set_offset(tar.size() + 512);
      im->set_size(image.size());
      if (spec.crc) im->set_crc32c(Crc32c(image));
      auto header = ReadImageHeader(image);
      im->set_format(static_cast<v1::ImageFormat>(header.ok() ? static_cast<int>(header->kind) : 0));
      im->set_width(spec.width);
      im->set_height(spec.height);
      tar.Add(img_name, image);
      v1::MemberRef* tx = info.mutable_text();
      tx->set_name(json_name);
      tx->set_offset(tar.size() + 512);
      tx->set_size(json.size());
      if (spec.crc) tx->set_crc32c(Crc32c(json));
      tar.Add(json_name, json);
      if (spec.audio_ms > 0) {
        const std::string wav = Wav(spec.audio_ms, spec.audio_rate);
        v1::MemberRef* au = info.add_audio();
        au->set_name(key + ".wav");
        au->set_offset(tar.size() + 512);
        au->set_size(wav.size());
        if (spec.crc) au->set_crc32c(Crc32c(wav));
        au->set_audio_ms(spec.audio_ms);
        tar.Add(key + ".wav", wav);
      }
      info.set_text_tokens(spec.text_tokens);
      infos.push_back(info);
    }
    const std::string bytes = tar.Finish();
    const std::string name = absl::StrFormat("train/shard-%05d.tar", s);
    std::filesystem::create_directories(dir + "/train");
    WriteFileAtomically(dir + "/" + name, bytes).IgnoreError();
    v1::ShardRef ref;
    ref.set_name(name);
    ref.set_size(bytes.size());
    ref.set_crc32c(spec.crc ? Crc32c(bytes) : 0);
    d.shards.push_back(ref);
    for (auto& i : infos) d.samples.push_back(std::move(i));
  }
  return d;
}

v1::JobInfo MakeJob(const Dataset& data, uint32_t world_size, uint32_t ranks_per_node,
                    uint64_t max_pixels) {
  v1::JobInfo job;
  v1::JobConfig* c = job.mutable_config();
  c->set_job_id("test");
  c->set_world_size(world_size);
  c->set_ranks_per_node(ranks_per_node);
  c->mutable_batch()->set_vl_samples_per_step(world_size);
  c->mutable_vision()->set_max_pixels(max_pixels);
  ApplyJobDefaults(c);
  job.set_config_fingerprint(JobFingerprint(*c, "test-dataset"));
  job.set_samples(data.samples.size());
  job.set_vl_samples(data.samples.size());
  for (const auto& s : data.shards) job.add_shards(s.name());
  return job;
}

v1::StepPlan MakePlan(const Dataset& data, const v1::JobInfo& job, uint64_t step,
                      const std::vector<uint32_t>& ranks_in, int per_rank) {
  const v1::JobConfig& c = job.config();
  std::vector<uint32_t> ranks = ranks_in;
  if (ranks.empty()) {
    for (uint32_t r = 0; r < c.world_size(); ++r) ranks.push_back(r);
  }
  v1::StepPlan plan;
  plan.set_step(step);
  plan.set_world_size(c.world_size());
  plan.set_ranks_per_node(c.ranks_per_node());
  plan.set_max_pixels(StageAt(c, step).max_pixels());
  plan.set_min_pixels(c.vision().min_pixels());
  plan.set_seq_len(StageAt(c, step).seq_len());
  plan.set_config_fingerprint(job.config_fingerprint());
  const VisionGeometryOptions geo = GeometryOptions(c, plan.max_pixels());
  std::map<uint32_t, uint32_t> shard_index;  // dataset shard -> plan shard
  for (uint32_t r : ranks) {
    v1::RankPlan* rp = plan.add_ranks();
    rp->set_rank(r);
    rp->set_node(r / c.ranks_per_node());
    v1::EncoderPhase* enc = rp->add_encoders();
    enc->set_encoder(v1::ENCODER_VISION);
    v1::EncoderPhase* audio = nullptr;
    v1::MicroBatch* mb = rp->add_micro_batches();
    mb->set_modality(v1::MODALITY_VL);
    v1::Sequence* seq = mb->add_sequences();
    uint32_t offset = 0;
    for (int k = 0; k < per_rank; ++k) {
      const size_t id = (step * c.world_size() * per_rank + r * per_rank + k) % data.samples.size();
      v1::SampleInfo info = data.samples[id];
      if (!shard_index.count(info.shard())) {
        const uint32_t idx = static_cast<uint32_t>(plan.shards_size());
        shard_index[info.shard()] = idx;
        *plan.add_shards() = data.shards[info.shard()];
      }
      const auto& m = info.images(0);
      auto g = SmartResize(m.height(), m.width(), geo);
      v1::ImagePlan* ip = enc->add_images();
      ip->set_sample_id(id);
      ip->set_image_index(0);
      ip->set_resized_height(g->height);
      ip->set_resized_width(g->width);
      ip->set_grid_t(1);
      ip->set_grid_h(g->grid_h);
      ip->set_grid_w(g->grid_w);
      ip->set_patches(g->patches);
      ip->set_llm_tokens(g->llm_tokens);
      ip->set_llm_rank(r);
      uint32_t audio_tokens = 0, markers = 2;
      if (info.audio_size() > 0) {
        if (audio == nullptr) {
          audio = rp->add_encoders();
          audio->set_encoder(v1::ENCODER_AUDIO);
        }
        v1::AudioPlan* ap = audio->add_audio();
        ap->set_sample_id(id);
        ap->set_audio_index(0);
        audio_tokens = AudioTokens(info.audio(0).audio_ms(), c.audio());
        ap->set_tokens(audio_tokens);
        ap->set_llm_rank(r);
        markers += 2;
      }
      v1::DocSlot* doc = seq->add_docs();
      doc->set_sample_id(id);
      doc->set_offset(offset);
      doc->set_length(g->llm_tokens + audio_tokens + markers + info.text_tokens());
      doc->set_encoder_tokens(g->llm_tokens + audio_tokens);
      offset += doc->length();
      bool have = false;
      for (const auto& s : plan.samples()) have |= s.sample_id() == id;
      if (!have) {
        info.set_shard(shard_index[info.shard()]);
        *plan.add_samples() = info;
      }
    }
    seq->set_tokens(offset);
  }
  return plan;
}

}  // namespace tutti::stager::testing
