#include "tools/datagen/dataset_gen.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <regex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/rng.h"
#include "common/status.h"
#include "common/tar.h"

namespace tutti::datagen {
namespace fs = std::filesystem;
namespace {

static_assert(std::endian::native == std::endian::little,
              "WAV and tar output assume little-endian");

constexpr size_t kTarEndMarker = 1024;  // two zero blocks
// The seed workload's image areas (common/workload.h), in megapixels.
constexpr double kSmallMinMp = kSeedWorkload.min_pixels / 1e6;
constexpr double kSmallMaxMp = kSeedWorkload.small_max_pixels / 1e6;
constexpr double kLargeMaxMp = kSeedWorkload.big_max_pixels / 1e6;
constexpr uint32_t kMinSide = 32;

const char* Extension(ImageKind kind) {
  switch (kind) {
    case ImageKind::kPng:
      return "png";
    case ImageKind::kWebp:
      return "webp";
    default:
      return "jpg";
  }
}

ImageSpec PlanImage(const GenDatasetOptions& opts, const FormatMix& formats, Rng& rng) {
  ImageSpec img;
  double mp = rng.Bernoulli(opts.large_fraction) ? rng.LogUniform(kSmallMaxMp, kLargeMaxMp)
                                                 : rng.LogUniform(kSmallMinMp, kSmallMaxMp);
  if (mp > opts.max_megapixels) mp = rng.LogUniform(opts.max_megapixels / 2, opts.max_megapixels);
  const double aspect = std::clamp(std::exp(0.45 * rng.Normal()), 0.25, 4.0);  // width / height
  const double pixels = mp * 1e6;
  auto side = [](double v) {
    return std::clamp(static_cast<uint32_t>(std::lround(v)), kMinSide, kMaxGeneratedSide);
  };
  img.width = side(std::sqrt(pixels * aspect));
  img.height = side(pixels / img.width);
  const double cap = opts.max_megapixels * 1e6;
  if (static_cast<double>(img.width) * img.height > cap) {
    img.height = std::max(kMinSide, static_cast<uint32_t>(cap / img.width));
  }
  double total = 0;
  for (double w : formats.weights) total += w;
  double pick = rng.Uniform(0, total);
  img.format = formats.kinds.back();
  for (size_t i = 0; i < formats.kinds.size(); ++i) {
    if (pick < formats.weights[i]) {
      img.format = formats.kinds[i];
      break;
    }
    pick -= formats.weights[i];
  }
  const double c = rng.Uniform();
  img.channels = c < 0.05 ? 1 : (img.format != ImageKind::kJpeg && c < 0.3 ? 4 : 3);
  img.seed = rng.Next();
  return img;
}

// The seed workload's images per sample: uniform in [min_images, max_images].
uint32_t ImageCount(Rng& rng) {
  const uint32_t lo = kSeedWorkload.min_images, hi = kSeedWorkload.max_images;
  return std::min(hi, lo + static_cast<uint32_t>(rng.Uniform() * (hi - lo + 1)));
}

// Writes all of data to fd; the error names path.
absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("write ", path));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

bool IsShardFile(const std::string& name) {
  static const std::regex re(R"(shard-[0-9]{6,}\.tar(\.tmp)?)");
  return std::regex_match(name, re);
}

// Creates out_dir or checks that it may be written into.
absl::Status PrepareOutDir(const GenDatasetOptions& opts) {
  std::error_code ec;
  const fs::path dir(opts.out_dir);
  if (!fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create output directory '", opts.out_dir, "': ", ec.message()));
    }
    return absl::OkStatus();
  }
  if (!fs::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--out '", opts.out_dir, "' exists and is not a directory; choose a directory path"));
  }
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(dir, ec)) entries.push_back(e.path().filename());
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot list output directory '", opts.out_dir, "': ", ec.message()));
  }
  if (entries.empty()) return absl::OkStatus();
  std::sort(entries.begin(), entries.end());
  if (!opts.force) {
    return absl::FailedPreconditionError(absl::StrCat(
        "output directory '", opts.out_dir, "' is not empty (", entries.size(), " entries, e.g. '",
        entries.front(),
        "'); choose a new or empty --out, or pass --force to replace its shard-*.tar files"));
  }
  for (const auto& name : entries) {
    if (!IsShardFile(name)) continue;
    fs::remove(dir / name, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot remove old shard '", (dir / name).string(), "': ", ec.message()));
    }
  }
  return absl::OkStatus();
}

// One shard being written: a temporary file renamed into place when done.
class ShardFile {
 public:
  ~ShardFile() { Abandon(); }

  absl::Status Open(const std::string& dir, const std::string& name) {
    final_ = (fs::path(dir) / name).string();
    tmp_ = final_ + ".tmp";
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return ErrnoStatus(errno, absl::StrCat("create ", tmp_));
    return absl::OkStatus();
  }
  absl::Status Append(absl::string_view data) { return WriteAll(fd_, data, tmp_); }
  absl::Status Commit() {
    RETURN_IF_ERROR(WriteAll(fd_, std::string(kTarEndMarker, '\0'), tmp_));
    if (::fsync(fd_) != 0) return ErrnoStatus(errno, absl::StrCat("fsync ", tmp_));
    ::close(fd_);
    fd_ = -1;
    if (::rename(tmp_.c_str(), final_.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("rename ", tmp_, " to ", final_));
    }
    tmp_.clear();
    return absl::OkStatus();
  }
  void Abandon() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!tmp_.empty()) ::unlink(tmp_.c_str());
    tmp_.clear();
  }

 private:
  int fd_ = -1;
  std::string tmp_, final_;
};

void AddToStats(const SampleSpec& spec, GenDatasetStats* stats) {
  ++stats->samples;
  stats->text_tokens += spec.input_ids.size();
  if (spec.images.empty() && spec.audio_ms == 0) ++stats->text_only;
  if (!spec.images.empty()) ++stats->with_images;
  if (spec.audio_ms > 0) ++stats->with_audio;
  stats->audio_ms += spec.audio_ms;
  for (const auto& img : spec.images) {
    const double mp = static_cast<double>(img.width) * img.height / 1e6;
    ++stats->images;
    ++stats->images_by_kind[static_cast<int>(img.format)];
    stats->image_megapixels += mp;
    stats->max_image_megapixels = std::max(stats->max_image_megapixels, mp);
    if (mp > kSmallMaxMp) ++stats->large_images;
  }
}

}  // namespace

std::string ShardName(uint64_t shard) { return absl::StrFormat("shard-%06d.tar", shard); }

absl::StatusOr<FormatMix> ParseFormats(absl::string_view spec) {
  FormatMix mix;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    std::pair<absl::string_view, absl::string_view> nw =
        absl::StrSplit(part, absl::MaxSplits(':', 1));
    const ImageKind kind = ImageKindFromExtension(nw.first);
    if (kind == ImageKind::kUnknown) {
      return absl::InvalidArgumentError(
          absl::StrCat("--formats: unknown image format '", nw.first,
                       "' (use jpg, png or webp, e.g. \"jpg:7,png:2,webp:1\")"));
    }
    double weight = 1.0;
    if (!nw.second.empty() && (!absl::SimpleAtod(nw.second, &weight) || !(weight > 0))) {
      return absl::InvalidArgumentError(absl::StrCat("--formats: weight '", nw.second, "' of ",
                                                     nw.first, " must be a positive number"));
    }
    if (std::find(mix.kinds.begin(), mix.kinds.end(), kind) != mix.kinds.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--formats: '", nw.first, "' is listed twice"));
    }
    mix.kinds.push_back(kind);
    mix.weights.push_back(weight);
  }
  if (mix.kinds.empty()) {
    return absl::InvalidArgumentError("--formats is empty; give at least one of jpg, png, webp");
  }
  return mix;
}

SampleSpec PlanSample(const GenDatasetOptions& opts, const FormatMix& formats, uint64_t index) {
  Rng rng(MixSeed(opts.seed, index));
  SampleSpec spec;
  spec.index = index;
  spec.key = absl::StrFormat("%09d", index);
  const bool images = !rng.Bernoulli(opts.text_fraction);
  const double n = rng.LogNormal(images ? opts.vl_text_tokens_median : opts.text_tokens_median,
                                 opts.text_tokens_sigma);
  const auto tokens = static_cast<uint32_t>(std::clamp(
      std::lround(n), 4l, static_cast<long>(std::max<uint32_t>(4, opts.max_text_tokens))));
  spec.input_ids.resize(tokens);
  for (auto& id : spec.input_ids) {
    // Skewed towards small ids, as frequent tokens are in BPE vocabularies.
    const double u = rng.Uniform();
    id = static_cast<int32_t>(u * u * kFirstSpecialTokenId);
  }
  const bool audio = rng.Bernoulli(opts.audio_fraction);
  if (images) {
    const uint32_t count = ImageCount(rng);
    for (uint32_t i = 0; i < count; ++i) spec.images.push_back(PlanImage(opts, formats, rng));
  }
  if (audio) {
    spec.audio_ms = static_cast<uint32_t>(rng.Between(1000, 30000));
    spec.audio_seed = rng.Next();
  }
  return spec;
}

absl::StatusOr<std::string> RenderSampleRecords(const GenDatasetOptions& opts,
                                                const SampleSpec& spec) {
  TarWriter tar;
  std::string json = "{\"input_ids\":[";
  for (size_t i = 0; i < spec.input_ids.size(); ++i) {
    absl::StrAppend(&json, i ? "," : "", spec.input_ids[i]);
  }
  json += "]}";
  tar.Add(spec.key + ".json", json);
  for (size_t i = 0; i < spec.images.size(); ++i) {
    auto encoded = RenderEncodedImage(spec.images[i], opts.encode);
    if (!encoded.ok())
      return Annotate(encoded.status(), absl::StrCat("sample ", spec.key, " image ", i));
    tar.Add(absl::StrCat(spec.key, ".", i, ".", Extension(spec.images[i].format)), *encoded);
  }
  if (spec.audio_ms > 0) {
    tar.Add(spec.key + ".wav", RenderWav(spec.audio_ms, opts.audio_sample_rate, spec.audio_seed));
  }
  std::string records = tar.Finish();
  records.resize(records.size() - kTarEndMarker);  // shards are concatenations of samples
  return records;
}

absl::Status ValidateGenOptions(const GenDatasetOptions& opts) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (opts.out_dir.empty()) return bad("--out is required: the directory to write shards into");
  // Keys are 9 digits; a shard is one tar the index reads whole (at most
  // 2^20 members by default, up to 6 a sample); the workers' window holds
  // 16 samples a thread.
  if (opts.samples == 0 || opts.samples > 1000000000) {
    return bad("--samples must be in [1, 1000000000], got ", opts.samples);
  }
  if (opts.samples_per_shard == 0 || opts.samples_per_shard > 65536) {
    return bad("--samples-per-shard must be in [1, 65536], got ", opts.samples_per_shard);
  }
  if (opts.threads > 1024) return bad("--threads must be in [0, 1024], got ", opts.threads);
  if (!(opts.text_fraction >= 0 && opts.text_fraction <= 1)) {
    return bad("--text-fraction must be in [0, 1], got ", opts.text_fraction);
  }
  if (!(opts.audio_fraction >= 0 && opts.audio_fraction <= 1)) {
    return bad("--audio-fraction must be in [0, 1], got ", opts.audio_fraction);
  }
  if (!(opts.large_fraction >= 0 && opts.large_fraction <= 1)) {
    return bad("--large-fraction must be in [0, 1], got ", opts.large_fraction);
  }
  if (!(opts.max_megapixels >= 0.01 && opts.max_megapixels <= 250)) {
    return bad("--max-megapixels must be in [0.01, 250], got ", opts.max_megapixels);
  }
  if (opts.max_text_tokens > (1u << 20)) {
    return bad("--max-text-tokens must be in [4, 1048576], got ", opts.max_text_tokens);
  }
  if (opts.text_tokens_median == 0) return bad("--text-tokens-median must be at least 1");
  if (opts.vl_text_tokens_median == 0) return bad("--vl-text-tokens-median must be at least 1");
  if (!(opts.text_tokens_sigma >= 0 && opts.text_tokens_sigma <= 4)) {
    return bad("--text-tokens-sigma must be in [0, 4], got ", opts.text_tokens_sigma);
  }
  if (opts.max_text_tokens < 4) return bad("--max-text-tokens must be at least 4");
  if (opts.audio_sample_rate < 1000 || opts.audio_sample_rate > 192000) {
    return bad("audio sample rate must be in [1000, 192000], got ", opts.audio_sample_rate);
  }
  if (opts.encode.jpeg_quality < 0 || opts.encode.jpeg_quality > 100) {
    return bad("--jpeg-quality must be in [0, 100], got ", opts.encode.jpeg_quality);
  }
  if (opts.encode.webp_quality < 1 || opts.encode.webp_quality > 100) {
    return bad("--webp-quality must be in [1, 100], got ", opts.encode.webp_quality);
  }
  if (opts.encode.png_compression < 0 || opts.encode.png_compression > 9) {
    return bad("--png-compression must be in [0, 9], got ", opts.encode.png_compression);
  }
  return ParseFormats(opts.formats).status();
}

absl::StatusOr<GenDatasetStats> GenerateDataset(
    const GenDatasetOptions& opts, const std::function<void(const GenProgress&)>& progress) {
  RETURN_IF_ERROR(ValidateGenOptions(opts));
  ASSIGN_OR_RETURN(const FormatMix formats, ParseFormats(opts.formats));
  RETURN_IF_ERROR(PrepareOutDir(opts));
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };

  const uint64_t total = opts.samples;
  const uint64_t shards = (total + opts.samples_per_shard - 1) / opts.samples_per_shard;
  const uint32_t threads =
      std::max<uint32_t>(1, opts.threads ? opts.threads : std::thread::hardware_concurrency());
  // Workers render samples in any order into a bounded window; this thread
  // writes them in index order, so the output does not depend on scheduling.
  struct Slot {
    bool ready = false;
    absl::StatusOr<std::string> records;
    SampleSpec spec;
  };
  // Wide enough that one slow 16 MP sample does not idle the other workers.
  const uint64_t window = std::max<uint64_t>(32, 16ull * threads);
  std::vector<Slot> ring(window);
  std::mutex mu;
  std::condition_variable work_cv, ready_cv;
  uint64_t next_claim = 0, next_write = 0;
  bool stop = false;

  auto worker = [&] {
    for (;;) {
      uint64_t i;
      {
        std::unique_lock<std::mutex> lock(mu);
        work_cv.wait(
            lock, [&] { return stop || next_claim >= total || next_claim < next_write + window; });
        if (stop || next_claim >= total) return;
        i = next_claim++;
      }
      SampleSpec spec = PlanSample(opts, formats, i);
      absl::StatusOr<std::string> records = RenderSampleRecords(opts, spec);
      std::lock_guard<std::mutex> lock(mu);
      Slot& slot = ring[i % window];
      slot.records = std::move(records);
      slot.spec = std::move(spec);
      slot.ready = true;
      ready_cv.notify_all();
    }
  };
  std::vector<std::thread> pool;
  for (uint32_t t = 0; t < threads; ++t) pool.emplace_back(worker);
  auto stop_pool = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    work_cv.notify_all();
    for (auto& t : pool) t.join();
    pool.clear();
  };

  GenDatasetStats stats;
  GenProgress prog;
  prog.samples_total = total;
  prog.shards_total = shards;
  ShardFile file;
  absl::Status status;
  for (uint64_t i = 0; i < total && status.ok(); ++i) {
    Slot taken;
    {
      std::unique_lock<std::mutex> lock(mu);
      ready_cv.wait(lock, [&] { return ring[i % window].ready; });
      taken = std::move(ring[i % window]);
      ring[i % window] = Slot();
      ++next_write;
    }
    work_cv.notify_all();
    if (!taken.records.ok()) {
      status = taken.records.status();
      break;
    }
    const uint64_t shard = i / opts.samples_per_shard;
    if (i % opts.samples_per_shard == 0) {
      status = file.Open(opts.out_dir, ShardName(shard));
      if (!status.ok()) break;
    }
    status = file.Append(*taken.records);
    if (!status.ok()) break;
    stats.bytes += taken.records->size();
    AddToStats(taken.spec, &stats);
    const bool last_in_shard = (i + 1) % opts.samples_per_shard == 0 || i + 1 == total;
    if (last_in_shard) {
      status = file.Commit();
      if (!status.ok()) break;
      stats.bytes += kTarEndMarker;
      stats.shards.push_back(ShardName(shard));
      prog.shards_done = stats.shards.size();
    }
    if (progress) {
      prog.samples_done = i + 1;
      prog.bytes_written = stats.bytes;
      prog.elapsed_seconds = elapsed();
      progress(prog);
    }
  }
  stop_pool();
  if (!status.ok()) {
    file.Abandon();
    return Annotate(status, absl::StrCat("writing the dataset in '", opts.out_dir, "'"));
  }
  stats.elapsed_seconds = elapsed();
  return stats;
}

}  // namespace tutti::datagen
