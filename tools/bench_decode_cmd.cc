// `tutti bench decode`: the stager's decode path (DCT-reduced JPEG decode,
// one-pass resize + normalise + patchify) against the path a user would
// write (full cv::imdecode, cv::resize, normalise, patchify as separate
// passes), on real photographs, in one run; and its scaling to two cores.
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <opencv2/core.hpp>

#include "absl/strings/str_format.h"
#include "common/file_io.h"
#include "common/media_header.h"
#include "common/smart_resize.h"
#include "services/stager/decode.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace {

using tutti::stager::PatchifyParams;

struct Image {
  std::string name;
  std::string bytes;
  tutti::ImageKind kind;
  uint32_t width, height;
};

std::vector<Image> Load(const std::string& dir, size_t max) {
  std::vector<Image> out;
  if (!std::filesystem::exists(dir)) return out;
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    if (max != 0 && out.size() >= max) break;
    auto bytes = tutti::ReadFileToString(f);
    if (!bytes.ok()) continue;
    auto h = tutti::ReadImageHeader(*bytes);
    if (!h.ok()) continue;
    out.push_back(Image{f, std::move(*bytes), h->kind, h->width, h->height});
  }
  return out;
}

using Clock = std::chrono::steady_clock;

// Whether a JPEG's frame is progressive (SOF2/6/10/14): the markers before
// the first scan are walked; anything unreadable counts as not progressive.
bool IsProgressiveJpeg(const std::string& b) {
  size_t pos = 2;  // after SOI
  while (pos + 4 <= b.size()) {
    if (static_cast<uint8_t>(b[pos]) != 0xFF) return false;
    const uint8_t m = static_cast<uint8_t>(b[pos + 1]);
    if (m == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    if (m == 0xC2 || m == 0xC6 || m == 0xCA || m == 0xCE) return true;
    if ((m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) || m == 0xDA) return false;
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {  // no length
      pos += 2;
      continue;
    }
    pos += 2 + (static_cast<size_t>(static_cast<uint8_t>(b[pos + 2])) << 8 |
                static_cast<uint8_t>(b[pos + 3]));
  }
  return false;
}

// Decodes one image through the fused or the naive path; false on failure.
bool DecodeOne(const Image& im, uint64_t max_pixels, bool fused, const PatchifyParams& p,
               std::vector<char>* out) {
  tutti::VisionGeometryOptions geo;
  geo.max_pixels = max_pixels;
  auto g = tutti::SmartResize(im.height, im.width, geo);
  if (!g.ok()) return false;
  out->resize(p.ImageBytes(g->height, g->width));
  absl::Status s = fused ? tutti::stager::DecodeImageInto(im.bytes, im.name, im.kind, g->height,
                                                          g->width, p, out->data())
                               .status()
                         : tutti::stager::NaiveDecodeInto(im.bytes, g->height, g->width, p, out->data());
  return s.ok();
}

// Seconds of CPU this thread has used (user + system, page faults included).
double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}

// Fused against naive on one core, interleaved image by image so that load
// from other processes hits both alike, each timed by the CPU time of the
// thread (images per CPU-second = images/s per core, however busy the
// machine is). Returns images/s of each.
std::pair<double, double> FusedVsNaive(const std::vector<Image>& images, uint64_t max_pixels,
                                       double seconds) {
  PatchifyParams p;
  std::vector<char> out;
  double t_fused = 0, t_naive = 0;
  uint64_t n = 0;
  for (int round = 0; round < 2 || t_fused + t_naive < 2 * seconds; ++round) {
    for (size_t i = 0; i < images.size(); ++i) {
      // Alternate which path goes first, so neither always runs with a warm cache.
      for (int k = 0; k < 2; ++k) {
        const bool fused = (k == 0) == ((round + i) % 2 == 0);
        const double t0 = ThreadCpuSeconds();
        if (!DecodeOne(images[i], max_pixels, fused, p, &out)) return {0, 0};
        (fused ? t_fused : t_naive) += ThreadCpuSeconds() - t0;
      }
      ++n;
    }
  }
  return {n / t_fused, n / t_naive};
}

double ProcessCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}

struct RateRun {
  uint64_t images = 0;
  double wall = 0, cpu = 0;  // seconds
  bool failed = false;
};

// The fused path on `threads` threads over `passes` passes of every image
// (whole passes, so both thread counts decode the same mix).
RateRun Rate(const std::vector<Image>& images, uint64_t max_pixels, int threads, int passes) {
  PatchifyParams p;
  const size_t total = images.size() * static_cast<size_t>(passes);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  const double cpu0 = ProcessCpuSeconds();
  const auto start = Clock::now();
  auto work = [&] {
    std::vector<char> out;
    for (size_t i; (i = next.fetch_add(1)) < total;) {
      if (!DecodeOne(images[i % images.size()], max_pixels, true, p, &out)) failed = true;
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back(work);
  for (auto& t : ts) t.join();
  RateRun r;
  r.wall = std::chrono::duration<double>(Clock::now() - start).count();
  r.cpu = ProcessCpuSeconds() - cpu0;
  r.images = total;
  r.failed = failed;
  return r;
}

// One and two worker threads, alternated in rounds (same run, same load). Wall-clock images/s of each, plus what explains the ratio: the CPU
// each image took, and how many cores the machine gave the two threads.
struct ScalingResult {
  double one = 0, two = 0;                // images/s
  double cpu_ms_one = 0, cpu_ms_two = 0;  // CPU per image
  double cores_two = 0;                   // CPU seconds per wall second with two threads
};
ScalingResult Scaling(std::vector<Image> images, uint64_t max_pixels, double seconds) {
  // Largest first, so two threads do not end with one of them idle behind a
  // big image.
  std::sort(images.begin(), images.end(), [](const Image& a, const Image& b) {
    return uint64_t{a.width} * a.height > uint64_t{b.width} * b.height;
  });
  RateRun one, two;
  for (int r = 0; r < 3 || one.wall + two.wall < seconds; ++r) {
    for (auto [threads, acc] : {std::pair{1, &one}, std::pair{2, &two}}) {
      const RateRun run = Rate(images, max_pixels, threads, threads);  // as many passes as threads
      acc->images += run.images;
      acc->wall += run.wall;
      acc->cpu += run.cpu;
      acc->failed |= run.failed;
    }
  }
  ScalingResult s;
  if (one.failed || two.failed) return s;
  s.one = one.images / one.wall;
  s.two = two.images / two.wall;
  s.cpu_ms_one = 1e3 * one.cpu / one.images;
  s.cpu_ms_two = 1e3 * two.cpu / two.images;
  s.cores_two = two.cpu / two.wall;
  return s;
}

struct Row {
  std::string name, unit, baseline_name;
  double tutti, baseline;
  std::string extra;  // more JSON fields, ", \"k\": v" each
};

int RunBenchDecode(int argc, char** argv) {
  tutti::tools::Cli cli(
      "tutti bench decode [--photos DIR] [--seconds S] [--json]",
      "Decode + resize + normalise + patchify of real photographs (Debian's wallpaper packages, "
      "fetched by tools/fetch_photos.sh into a cache directory) at max_pixels 1 MP and 16 MP: "
      "tutti's fused path versus the naive separate passes, one core each, interleaved image by "
      "image in the same run and timed by each thread's CPU time (images/s per core); then tutti "
      "with two decode threads versus one, alternated in rounds and timed by the wall clock.");
  std::string photos, fetch = "tools/fetch_photos.sh", only;
  double seconds = 3;
  uint64_t max_images = 0;
  bool json = false;
  cli.Flag("photos", &photos, "directory with jpeg/, png/, webp/ (empty: run --fetch to get them)");
  cli.Flag("fetch", &fetch, "script that fetches the photographs and prints their directory");
  cli.Flag("seconds", &seconds, "minimum seconds per measurement");
  cli.Flag("max_images", &max_images, "photographs per format, in name order (0 = all; fewer = quicker)");
  cli.Flag("cases", &only, "run only cases whose name contains this text (empty = all)");
  cli.Flag("json", &json, "one JSON object per case instead of a table");
  int rc;
  if (!cli.Parse(argc, argv, &rc)) return rc;
  if (photos.empty()) {
    std::fprintf(stderr, "fetching photographs with %s ...\n", fetch.c_str());
    FILE* p = ::popen(fetch.c_str(), "r");
    char buf[4096] = {0};
    if (p == nullptr || std::fgets(buf, sizeof(buf), p) == nullptr) {
      std::fprintf(stderr, "tutti bench decode: %s failed; pass --photos DIR\n", fetch.c_str());
      if (p) ::pclose(p);
      return 1;
    }
    ::pclose(p);
    photos = buf;
    while (!photos.empty() && (photos.back() == '\n' || photos.back() == '\r')) photos.pop_back();
  }
  cv::setNumThreads(1);  // per-core numbers: no hidden OpenCV threads
  const auto jpeg = Load(photos + "/jpeg", max_images);
  const auto png = Load(photos + "/png", max_images);
  const auto webp = Load(photos + "/webp", max_images);
  if (jpeg.empty()) {
    std::fprintf(stderr, "tutti bench decode: no JPEG photographs under %s/jpeg\n", photos.c_str());
    return 1;
  }
  std::vector<Row> rows;
  auto wanted = [&](const std::string& name) { return name.find(only) != std::string::npos; };
  auto vs = [&](const char* name, const std::vector<Image>& imgs, uint64_t mp) {
    if (imgs.empty() || !wanted(name)) return;
    std::fprintf(stderr, "%s: %zu images ...\n", name, imgs.size());
    const auto [fused, naive] = FusedVsNaive(imgs, mp, seconds);
    rows.push_back(Row{name, "images/s/core", "naive imdecode+resize+normalise+patchify", fused, naive, ""});
  };
  vs("decode_jpeg_1mp_vs_naive", jpeg, 1003520);
  // The same, split by JPEG encoding: a progressive JPEG's entropy decoding
  // (most of its cost) does not shrink with DCT-domain scaling.
  std::vector<Image> baseline_jpeg, progressive_jpeg;
  for (const Image& im : jpeg) {
    (IsProgressiveJpeg(im.bytes) ? progressive_jpeg : baseline_jpeg).push_back(im);
  }
  vs("decode_jpeg_1mp_baseline_only_vs_naive", baseline_jpeg, 1003520);
  vs("decode_jpeg_1mp_progressive_only_vs_naive", progressive_jpeg, 1003520);
  vs("decode_jpeg_16mp_vs_naive", jpeg, 16777216);
  vs("decode_png_1mp_vs_naive", png, 1003520);
  vs("decode_webp_1mp_vs_naive", webp, 1003520);
  if (wanted("decode_scaling_2_cores")) {
  std::fprintf(stderr, "decode_scaling_2_cores ...\n");
  const ScalingResult sc = Scaling(jpeg, 1003520, 2 * seconds);
  rows.push_back(Row{"decode_scaling_2_cores", "images/s", "tutti on 1 core", sc.two, sc.one,
                     absl::StrFormat(", \"cpu_ms_per_image_1\": %.2f, \"cpu_ms_per_image_2\": %.2f, "
                                     "\"cores_given_2\": %.2f",
                                     sc.cpu_ms_one, sc.cpu_ms_two, sc.cores_two)});
  }
  if (json) {
    for (const auto& r : rows) {
      std::printf("{\"case\": \"%s\", \"tutti\": %.3f, \"baseline\": %.3f, \"baseline_name\": \"%s\", "
                  "\"ratio\": %.3f, \"unit\": \"%s\"%s}\n",
                  r.name.c_str(), r.tutti, r.baseline, r.baseline_name.c_str(),
                  r.baseline > 0 ? r.tutti / r.baseline : 0, r.unit.c_str(), r.extra.c_str());
    }
  } else {
    std::printf("%-41s %12s %12s %7s  %-14s %s\n", "case", "tutti", "baseline", "ratio", "unit", "baseline");
    for (const auto& r : rows) {
      std::printf("%-41s %12.2f %12.2f %7.2f  %-14s %s\n", r.name.c_str(), r.tutti, r.baseline,
                  r.baseline > 0 ? r.tutti / r.baseline : 0, r.unit.c_str(), r.baseline_name.c_str());
      if (!r.extra.empty()) std::printf("%41s %s\n", "", r.extra.c_str() + 2);
    }
    std::printf("photographs: %s (jpeg %zu: %zu progressive, png %zu, webp %zu); per-core rates are images per "
                "CPU-second of the decoding thread, the 2-core case is wall-clock throughput\n",
                photos.c_str(), jpeg.size(), progressive_jpeg.size(), png.size(), webp.size());
  }
  return 0;
}

}  // namespace

TUTTI_COMMAND("bench decode", "benchmark the stager's decode path against the naive one", RunBenchDecode);
