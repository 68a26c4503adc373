// Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/):
// small valid inputs of every format each parser reads, so that the fuzzers
// start from the interesting structure instead of discovering it.
//   tutti-fuzz-seeds fuzz/corpus
// The output is deterministic; the corpora in the repository were written
// by it (rerun it after a format change).
#include <fcntl.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/tar.h"
#include "fuzz/fuzz_job.h"
#include "services/packer/bench/synthetic.h"
#include "services/packer/core/job.h"
#include "services/packer/core/planner.h"
#include "services/packer/index/index.h"
#include "services/packer/index/index_builder.h"
#include "services/packer/plan_proto.h"
#include "tutti/v1/packer.pb.h"
#include "tutti/v1/stager.pb.h"

namespace {

namespace fs = std::filesystem;

bool failed = false;

void Write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
    failed = true;
  }
}

// A smooth colour gradient (compresses like a photograph, not like noise).
cv::Mat Picture(int rows, int cols) {
  cv::Mat m(rows, cols, CV_8UC3);
  for (int y = 0; y < rows; ++y) {
    for (int x = 0; x < cols; ++x) {
      m.at<cv::Vec3b>(y, x) =
          cv::Vec3b(static_cast<uint8_t>(x * 255 / cols), static_cast<uint8_t>(y * 255 / rows),
                    static_cast<uint8_t>((x + y) * 127 / (rows + cols)));
    }
  }
  return m;
}

std::string Encode(const char* ext, const cv::Mat& m, std::vector<int> params = {}) {
  std::vector<uint8_t> buf;
  if (!cv::imencode(ext, m, buf, params)) {
    std::fprintf(stderr, "cannot encode %s\n", ext);
    failed = true;
  }
  return std::string(buf.begin(), buf.end());
}

void Le(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// A RIFF/WAVE file: format 1 (PCM) or 3 (float), frames of a ramp.
std::string Wav(uint16_t format, uint16_t channels, uint32_t rate, uint16_t bits, uint32_t frames) {
  std::string data;
  for (uint32_t i = 0; i < frames * channels; ++i) {
    if (format == 3) {
      float v = static_cast<float>(i % 64) / 64.0f - 0.5f;
      uint32_t u;
      std::memcpy(&u, &v, 4);
      Le(&data, u, 4);
    } else {
      Le(&data, (i * 977) & ((1u << bits) - 1), bits / 8);
    }
  }
  const uint16_t align = static_cast<uint16_t>(channels * bits / 8);
  std::string w = "RIFF";
  Le(&w, 36 + data.size(), 4);
  w += "WAVEfmt ";
  Le(&w, 16, 4);
  Le(&w, format, 2);
  Le(&w, channels, 2);
  Le(&w, rate, 4);
  Le(&w, uint64_t{rate} * align, 4);
  Le(&w, align, 2);
  Le(&w, bits, 2);
  w += "data";
  Le(&w, data.size(), 4);
  return w + data;
}

// A tar header block for `name` of `size` bytes, type `type`, with the size
// field in GNU base-256 when `base256`.
std::string Header(const std::string& name, uint64_t size, char type, bool base256) {
  std::string h(512, '\0');
  std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 99));
  std::memcpy(h.data() + 100, "0000644", 7);
  if (base256) {
    h[124] = static_cast<char>(0x80);
    for (int i = 0; i < 8; ++i) h[135 - i] = static_cast<char>((size >> (8 * i)) & 0xFF);
  } else {
    std::snprintf(h.data() + 124, 12, "%011llo", static_cast<unsigned long long>(size));
  }
  h[156] = type;
  std::memcpy(h.data() + 257, "ustar\00000", 8);
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(h.data() + 148, 8, "%06o", sum);
  return h;
}

std::string Padded(const std::string& data) {
  return data + std::string((512 - data.size() % 512) % 512, '\0');
}

void TarSeeds(const fs::path& dir, const std::string& jpeg) {
  tutti::TarWriter w;
  w.Add("000000.json", R"({"input_ids": [1, 2, 3]})");
  w.Add("000000.jpg", jpeg);
  w.Add("000001.txt", "a caption");
  w.Add("000001.0.png", "not really a png");
  Write(dir, "webdataset.tar", w.Finish());
  // A GNU long name ('L'), a pax path ('x') and a base-256 size.
  const std::string long_name(150, 'k');
  std::string t = Header("././@LongLink", long_name.size() + 1, 'L', false) +
                  Padded(long_name + '\0') + Header("short", 3, '0', false) + Padded("abc");
  const std::string pax = "21 path=dir/paxname\n";
  t += Header("PaxHeader", pax.size(), 'x', false) + Padded(pax) +
       Header("ignored", 5, '0', false) + Padded("hello");
  t += Header("big.bin", 7, '0', true) + Padded("payload");
  t += std::string(1024, '\0');
  Write(dir, "longname-pax-base256.tar", t);
}

void PlanSeeds(const fs::path& dir) {
  tutti::packer::SyntheticOptions o;
  o.samples = 64;
  o.samples_per_shard = 16;
  o.small_max_pixels = 200000;
  o.big_max_pixels = 400000;
  o.min_pixels = 20000;
  o.text_median_tokens = 200;
  o.vl_text_median_tokens = 40;
  o.max_text_tokens = 1500;
  o.audio_fraction = 0.25;
  o.fit_seq_len = 2048;
  o.fit_max_pixels = 200704;
  auto bytes = tutti::packer::MakeSyntheticIndex(o);
  auto config = tutti::ParseJobConfig(tutti::fuzz::kFuzzJobConfig, "fuzz_job.h");
  if (!bytes.ok() || !config.ok()) {
    std::fprintf(stderr, "seed job: %s %s\n", bytes.status().ToString().c_str(),
                 config.status().ToString().c_str());
    failed = true;
    return;
  }
  Write(dir.parent_path() / "index_fuzzer", "synthetic.idx", *bytes);
  auto index = tutti::packer::Index::FromString(*bytes, "synthetic.idx");
  tutti::ApplyJobDefaults(&*config);
  auto job = index.ok() ? tutti::packer::Job::Create(*config, *index)
                        : absl::StatusOr<std::shared_ptr<const tutti::packer::Job>>(index.status());
  if (!job.ok()) {
    std::fprintf(stderr, "seed job: %s\n", job.status().ToString().c_str());
    failed = true;
    return;
  }
  tutti::packer::Planner planner(*job);
  for (uint64_t step = 0; step < 3; ++step) {
    tutti::packer::StepPlanData data;
    tutti::v1::StepPlan plan;
    absl::Status s = planner.Plan(step, &data);
    if (s.ok()) s = tutti::packer::BuildStepPlan(**job, data, {}, &plan);
    if (!s.ok()) {
      std::fprintf(stderr, "seed plan %llu: %s\n", static_cast<unsigned long long>(step),
                   s.ToString().c_str());
      failed = true;
      return;
    }
    plan.mutable_stats()->set_plan_seconds(0);
    Write(dir, absl::StrCat("step", step, ".pb"), plan.SerializeAsString());
  }
}

// An index built from shards (member checksums, skip counts, a shard left
// out), beside the synthetic one PlanSeeds writes. The shards are written
// under a fixed path with fixed times, so the index is the same every run.
void IndexSeeds(const fs::path& dir, const std::string& jpeg, const std::string& png) {
  const fs::path src = fs::temp_directory_path() / "tutti-fuzz-seeds-shards";
  fs::remove_all(src);
  fs::create_directories(src);
  tutti::TarWriter a;
  a.Add("000000.json", R"({"input_ids": [101, 7592, 102]})");
  a.Add("000001.json", R"({"num_tokens": 12})");
  a.Add("000001.0.jpg", jpeg);
  a.Add("000001.1.png", png);
  a.Add("000002.txt", "a caption");
  a.Add("000002.wav", std::string(44, '\0'));       // a bad audio header: skipped
  a.Add("000003.json", R"({"input_ids": [1, 2})");  // bad JSON: skipped
  // Schema 2, interleaved: the images' placeholders (9) after some text, so
  // the index records where they are (MPOS).
  a.Add("000005.json",
        R"({"schema": 2, "input_ids": [1, 2, 9, 3, 4, 9, 5], "trained": [[3, 5]]})");
  a.Add("000005.0.jpg", jpeg);
  a.Add("000005.1.png", png);
  tutti::TarWriter b;
  b.Add("sub/000004.json", R"({"input_ids": [5]})");
  const std::string bad = b.Finish();
  const std::pair<std::string, std::string> shards[] = {
      {"a-000.tar", a.Finish()}, {"b-001.tar", bad}, {"c-002.tar", bad.substr(0, 700)}};
  for (const auto& [name, bytes] : shards) {
    Write(src, name, bytes);
    const struct timespec t[2] = {{1700000000, 0}, {1700000000, 0}};
    ::utimensat(AT_FDCWD, (src / name).c_str(), t, 0);
  }
  tutti::packer::IndexBuildOptions o;
  o.source_dir = src.string();
  o.image_placeholder_id = 9;
  auto bytes = tutti::packer::BuildIndex(o, nullptr, nullptr);
  fs::remove_all(src);
  if (!bytes.ok()) {
    std::fprintf(stderr, "seed index: %s\n", bytes.status().ToString().c_str());
    failed = true;
    return;
  }
  Write(dir, "built.idx", *bytes);
}

// One request of each method (the first byte picks it, rpc_request_fuzzer.cc).
void RequestSeeds(const fs::path& dir) {
  auto seed = [&](const char* name, char method, const google::protobuf::Message& m) {
    Write(dir, name, std::string(1, method) + m.SerializeAsString());
  };
  seed("get_job", 0, tutti::v1::GetJobRequest());
  tutti::v1::GetPlanRequest plan;
  plan.set_step(12);
  for (uint32_t r : {0u, 3u, 7u}) plan.add_ranks(r);
  plan.set_world_size(8);
  plan.set_config_fingerprint("0123456789abcdef");
  seed("get_plan", 1, plan);
  tutti::v1::StreamPlansRequest stream;
  stream.set_start_step(4);
  stream.set_end_step(8);
  stream.add_ranks(1);
  seed("stream_plans", 2, stream);
  tutti::v1::StepTimingReport report;
  report.set_step(3);
  report.set_rank(2);
  auto* phase = report.add_phases();
  phase->set_phase("vit");
  phase->set_seconds(0.25);
  seed("report_timing", 3, report);
  seed("get_stage_status", 4, tutti::v1::GetStageStatusRequest());
  tutti::v1::AcquireBatchRequest acquire;
  acquire.set_step(5);
  acquire.set_rank(1);
  acquire.set_timeout_ms(1000);
  acquire.set_incarnation(0x5eed);
  acquire.set_key(std::string(16, 'k'));
  seed("acquire_batch", 5, acquire);
  tutti::v1::ReleaseBatchRequest release;
  release.set_step(5);
  release.set_rank(1);
  release.set_incarnation(0x5eed);
  release.set_key(std::string(16, 'k'));
  seed("release_batch", 6, release);
  tutti::v1::RenewLeasesRequest renew;
  renew.set_rank(1);
  renew.set_incarnation(0x5eed);
  renew.set_key(std::string(16, 'k'));
  renew.add_steps(5);
  renew.add_steps(6);
  seed("renew_leases", 7, renew);
  tutti::v1::RegisterRankRequest register_rank;
  register_rank.set_rank(1);
  tutti::v1::NodeReport node;
  node.set_node(2);
  node.set_config_fingerprint("0123456789abcdef");
  node.set_cache_capacity_bytes(uint64_t{1} << 30);
  node.set_cache_held_bytes(uint64_t{3} << 28);
  node.set_refused_shards(1);
  node.add_refused_shard_names("shard-00007.tar");
  seed("node_report", 8, node);
  tutti::v1::FetchMembersRequest fetch;
  fetch.mutable_shard()->set_name("shard-00003.tar");
  fetch.mutable_shard()->set_size(1 << 20);
  auto* member = fetch.add_members();
  member->set_name("000042.0.jpg");
  member->set_offset(512);
  member->set_size(2048);
  fetch.set_from_node(1);
  seed("fetch_members", 9, fetch);
  seed("register_rank", 10, register_rank);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus-dir>\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  const cv::Mat pic = Picture(40, 60);
  const std::string jpeg = Encode(".jpg", pic, {cv::IMWRITE_JPEG_QUALITY, 80});
  const std::string progressive =
      Encode(".jpg", Picture(64, 48), {cv::IMWRITE_JPEG_PROGRESSIVE, 1});
  const std::string png = Encode(".png", pic);
  const std::string webp = Encode(".webp", pic, {cv::IMWRITE_WEBP_QUALITY, 75});
  const std::string webp_lossless = Encode(".webp", pic, {cv::IMWRITE_WEBP_QUALITY, 101});
  const std::string wav_pcm16 = Wav(1, 1, 16000, 16, 320);
  const std::string wav_float = Wav(3, 2, 8000, 32, 64);
  const std::string wav_pcm8 = Wav(1, 1, 8000, 8, 100);

  TarSeeds(out / "tar_fuzzer", jpeg);
  for (const char* target : {"media_header_fuzzer", "image_decode_fuzzer"}) {
    // image_decode_fuzzer reads a selector byte first (format and size).
    const std::string sel = std::string(target) == "image_decode_fuzzer" ? "\x04" : "";
    Write(out / target, "baseline.jpg", sel + jpeg);
    Write(out / target, "progressive.jpg", sel + progressive);
    Write(out / target, "gradient.png", sel + png);
    Write(out / target, "lossy.webp", sel + webp);
    Write(out / target, "lossless.webp", sel + webp_lossless);
  }
  Write(out / "media_header_fuzzer", "pcm16.wav", wav_pcm16);
  Write(out / "media_header_fuzzer", "float-stereo.wav", wav_float);
  // wav_decode_fuzzer: rate selector, sample count / 37, the file.
  Write(out / "wav_decode_fuzzer", "pcm16.wav", std::string("\x00\x08", 2) + wav_pcm16);
  Write(out / "wav_decode_fuzzer", "float-stereo.wav", std::string("\x01\x03", 2) + wav_float);
  Write(out / "wav_decode_fuzzer", "pcm8.wav", std::string("\x02\x40", 2) + wav_pcm8);
  Write(out / "member_json_fuzzer", "input_ids.json",
        R"({"input_ids": [101, 7592, 2088, 102], "text": "hello world"})");
  Write(out / "member_json_fuzzer", "num_tokens.json",
        R"({"num_tokens": 12, "meta": {"a": [1, {}]}})");
  Write(out / "member_json_fuzzer", "text.json", R"({"text": "a caption \"quoted\" \u00e9"})");
  Write(out / "job_config_fuzzer", "fuzz_job.pbtxt", tutti::fuzz::kFuzzJobConfig);
  Write(out / "job_config_fuzzer", "curriculum.pbtxt", R"pb(
    world_size: 8
    ranks_per_node: 4
    epochs: 1
    vision { patch_size: 14 merge_size: 2 max_pixels: 1003520 output_dtype: DTYPE_BFLOAT16 }
    batch {
      text_samples_per_step: 64
      vl_samples_per_step: 32
      grad_accum: 4
      text_micro_batch: 2
      vl_micro_batch: 2
      text_vl_ratio: "1:1"
    }
    curriculum { start_step: 0 max_pixels: 262144 seq_len: 4096 }
    curriculum { start_step: 100 max_pixels: 1003520 seq_len: 8192 }
    packing { strategy: "seed-v2" open_bins: 4 }
  )pb");
  PlanSeeds(out / "plan_fuzzer");
  IndexSeeds(out / "index_fuzzer", jpeg, png);
  RequestSeeds(out / "rpc_request_fuzzer");
  return failed ? 1 : 0;
}
