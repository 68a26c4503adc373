// `tutti bench decode`: the stager's decode path (decode, HF-parity resize,
// normalise, patchify in one pass) against HF's Qwen2-VL preprocessing in
// Python (PIL + numpy, tools/hf_preprocess.py) on real photographs, in one
// run, image by image; beside it the same codec's decode alone, the time to
// write the output alone (the floor of anything beyond the decode) and the
// opt-in fast resize; then the scaling from one to two decode threads.
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <opencv2/core.hpp>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_io.h"
#include "common/media_header.h"
#include "common/smart_resize.h"
#include "services/stager/decode/decode.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace {

using tutti::stager::PatchifyParams;
using tutti::stager::ResizeMode;

struct Image {
  std::string name;  // the file's path
  std::string bytes;
  tutti::ImageKind kind;
  uint32_t width, height;
};

std::vector<Image> Load(const std::string& dir, size_t max) {
  std::vector<Image> out;
  if (!std::filesystem::exists(dir)) return out;
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    files.push_back(std::filesystem::absolute(e.path()).string());
  }
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

// HF's preprocessing in a Python process (tools/hf_preprocess.py), one
// request per image over a pipe; it reports the CPU time of its own thread.
class HfPath {
 public:
  HfPath(const std::string& python, const std::string& script) {
    ::signal(SIGPIPE, SIG_IGN);  // a Python process that died is an error, not our end
    int to[2], from[2];
    if (::pipe(to) != 0 || ::pipe(from) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(to[0], 0);
      ::dup2(from[1], 1);
      ::close(to[1]);
      ::close(from[0]);
      ::setenv("OMP_NUM_THREADS", "1", 1);
      ::setenv("OPENBLAS_NUM_THREADS", "1", 1);
      ::execl(python.c_str(), python.c_str(), script.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(to[0]);
    ::close(from[1]);
    in_ = ::fdopen(to[1], "w");
    out_ = ::fdopen(from[0], "r");
  }
  ~HfPath() {
    if (in_) std::fclose(in_);
    if (out_) std::fclose(out_);
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
  }
  // CPU seconds of the whole path to (height, width), or of PIL's decode
  // alone when height is 0; negative on failure (`error_` says why).
  double Time(const Image& im, uint32_t height, uint32_t width) {
    if (!in_ || !out_) return Fail("cannot start the Python process");
    const std::string req = height == 0 ? absl::StrCat("time decode ", im.name, "\n")
                                        : absl::StrCat("time full ", im.name, " ", height, " ",
                                                       width, "\n");
    char line[512];
    if (std::fputs(req.c_str(), in_) < 0 || std::fflush(in_) != 0 ||
        std::fgets(line, sizeof(line), out_) == nullptr) {
      return Fail("the Python process ended (is python3-pil installed?)");
    }
    char* end = nullptr;
    const double s = std::strtod(line, &end);
    if (end == line) return Fail(line);
    return s;
  }
  const std::string& error() const { return error_; }

 private:
  double Fail(const std::string& why) {
    if (error_.empty()) error_ = why;
    return -1;
  }
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
  std::string error_;
};

// Seconds of CPU this thread has used (user + system, page faults included).
double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}

bool Target(const Image& im, uint64_t max_pixels, uint32_t* h, uint32_t* w) {
  tutti::VisionGeometryOptions geo;
  geo.max_pixels = max_pixels;
  auto g = tutti::SmartResize(im.height, im.width, geo);
  if (!g.ok()) return false;
  *h = g->height;
  *w = g->width;
  return true;
}

// Writes `bytes` of output the way the patchify step does (non-temporal
// stores, nothing read or computed): the least time any path that writes
// the output can take beyond its decode.
void StoreOnly(char* out, size_t bytes) {
#if defined(__SSE2__)
  const __m128i v = _mm_set1_epi32(0x3F000000);
  size_t i = (16 - (reinterpret_cast<uintptr_t>(out) & 15)) & 15;
  std::memset(out, 0, std::min(i, bytes));
  for (; i + 16 <= bytes; i += 16) _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), v);
  if (i < bytes) std::memset(out + i, 0, bytes - i);
  _mm_sfence();
#else
  std::memset(out, 0, bytes);
#endif
}

// CPU seconds per image of each path, summed over the images measured.
struct PathTimes {
  double hf = 0, parity = 0, fast = 0, decode = 0, store = 0;
  uint64_t images = 0;
  std::string error;
};

// Every path on one core, interleaved image by image (the order rotating,
// so none always runs with a warm cache) and timed by thread CPU time, so
// load from other processes hits them alike.
PathTimes Measure(const std::vector<Image>& images, uint64_t max_pixels, double seconds,
                  HfPath* hf) {
  PathTimes t;
  PatchifyParams parity, fast;
  fast.resize = ResizeMode::kFast;
  std::vector<char> out;
  for (int round = 0; round == 0 || t.parity + t.fast + t.decode + t.hf + t.store < seconds;
       ++round) {
    for (size_t i = 0; i < images.size(); ++i) {
      const Image& im = images[i];
      uint32_t h, w;
      if (!Target(im, max_pixels, &h, &w)) continue;
      out.resize(parity.ImageBytes(h, w));
      for (int k = 0; k < 5; ++k) {
        const int which = static_cast<int>((k + i + round) % 5);
        const double t0 = ThreadCpuSeconds();
        bool ok = true;
        switch (which) {
          case 0:
            ok = tutti::stager::DecodeImageInto(im.bytes, im.name, im.kind, h, w, parity, out.data())
                     .ok();
            t.parity += ThreadCpuSeconds() - t0;
            break;
          case 1:
            ok = tutti::stager::DecodeImageInto(im.bytes, im.name, im.kind, h, w, fast, out.data())
                     .ok();
            t.fast += ThreadCpuSeconds() - t0;
            break;
          case 2: {
            tutti::stager::DecodeInfo info;
            ok = tutti::stager::DecodeForTarget(im.bytes, im.name, im.kind, h, w, parity, &info)
                     .ok();
            t.decode += ThreadCpuSeconds() - t0;
            break;
          }
          case 3: {
            const double s = hf->Time(im, h, w);
            ok = s >= 0;
            t.hf += s;
            break;
          }
          case 4:
            StoreOnly(out.data(), out.size());
            t.store += ThreadCpuSeconds() - t0;
            break;
        }
        if (!ok) {
          t.error = which == 3 ? hf->error() : absl::StrCat(im.name, " does not decode");
          return t;
        }
      }
      ++t.images;
    }
  }
  return t;
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

// The parity path on `threads` threads over `passes` passes of every image
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
      const Image& im = images[i % images.size()];
      uint32_t h, w;
      if (!Target(im, max_pixels, &h, &w)) continue;
      out.resize(p.ImageBytes(h, w));
      if (!tutti::stager::DecodeImageInto(im.bytes, im.name, im.kind, h, w, p, out.data()).ok()) {
        failed = true;
      }
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

// One and two worker threads, alternated in rounds (same run, same load).
// Wall-clock images/s of each, plus what explains the ratio: the CPU each
// image took, and how many cores the machine gave the two threads.
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

std::string FetchPhotos(const std::string& fetch) {
  std::fprintf(stderr, "fetching photographs with %s ...\n", fetch.c_str());
  FILE* p = ::popen(fetch.c_str(), "r");
  char buf[4096] = {0};
  if (p == nullptr || std::fgets(buf, sizeof(buf), p) == nullptr) {
    if (p) ::pclose(p);
    return "";
  }
  ::pclose(p);
  std::string dir = buf;
  while (!dir.empty() && (dir.back() == '\n' || dir.back() == '\r')) dir.pop_back();
  return dir;
}

int RunBenchDecode(int argc, char** argv) {
  tutti::tools::Cli cli(
      "tutti bench decode [--photos DIR] [--seconds S] [--json]",
      "Decode + resize + normalise + patchify of real photographs (Debian's wallpaper packages, "
      "fetched by tools/fetch_photos.sh into a cache directory) at max_pixels 1 MP and 16 MP: "
      "tutti's HF-parity path (the default) versus HF's Qwen2-VL preprocessing in Python "
      "(PIL + numpy, tools/hf_preprocess.py), with the same codec's decode alone and the fast "
      "resize beside it; one core each, interleaved image by image in the same run and timed by "
      "each thread's CPU time (images per CPU-second); then tutti with two decode threads "
      "versus one, alternated in rounds and timed by the wall clock.");
  std::string photos, fetch = "tools/fetch_photos.sh", only;
  std::string python = "/usr/bin/python3", script = "tools/hf_preprocess.py";
  double seconds = 3;
  uint64_t max_images = 0;
  bool json = false;
  cli.Flag("photos", &photos, "directory with jpeg/, png/, webp/ (empty: run --fetch to get them)");
  cli.Flag("fetch", &fetch, "script that fetches the photographs and prints their directory");
  cli.Flag("python", &python, "Python with PIL and numpy for the HF-style baseline");
  cli.Flag("hf_script", &script, "the HF-style preprocessing script");
  cli.Flag("seconds", &seconds, "minimum CPU seconds per case (at least one pass over the images)");
  cli.Flag("max_images", &max_images, "photographs per format, in name order (0 = all; fewer = quicker)");
  cli.Flag("cases", &only, "run only cases whose name contains this text (empty = all)");
  cli.Flag("json", &json, "one JSON object per case instead of a table");
  int rc;
  if (!cli.Parse(argc, argv, &rc)) return rc;
  if (photos.empty() && (photos = FetchPhotos(fetch)).empty()) {
    std::fprintf(stderr, "tutti bench decode: %s failed; pass --photos DIR\n", fetch.c_str());
    return 1;
  }
  if (access(script.c_str(), R_OK) != 0) {
    std::fprintf(stderr, "tutti bench decode: cannot read %s; run from the source tree or pass --hf_script\n",
                 script.c_str());
    return 1;
  }
  cv::setNumThreads(1);  // per-core numbers: no hidden OpenCV threads
  const auto jpeg = Load(photos + "/jpeg", max_images);
  const auto png = Load(photos + "/png", max_images);
  const auto webp = Load(photos + "/webp", max_images);
  if (jpeg.empty()) {
    std::fprintf(stderr, "tutti bench decode: no JPEG photographs under %s/jpeg\n", photos.c_str());
    return 1;
  }
  HfPath hf(python, script);
  std::vector<Row> rows;
  auto wanted = [&](const std::string& name) { return name.find(only) != std::string::npos; };
  auto vs = [&](const std::string& name, const std::vector<Image>& imgs, uint64_t mp) -> bool {
    if (imgs.empty() || !wanted(name)) return true;
    std::fprintf(stderr, "%s: %zu images ...\n", name.c_str(), imgs.size());
    const PathTimes t = Measure(imgs, mp, seconds, &hf);
    if (!t.error.empty()) {
      std::fprintf(stderr, "tutti bench decode: %s: %s\n", name.c_str(), t.error.c_str());
      return false;
    }
    const double n = static_cast<double>(t.images);
    rows.push_back(Row{name, "images/s/core", "HF Qwen2-VL preprocessing (PIL + numpy)",
                       n / t.parity, n / t.hf,
                       absl::StrFormat(", \"decode_only\": %.3f, \"over_decode_only\": %.3f, "
                                       "\"store_floor\": %.3f, "
                                       "\"fast\": %.3f, \"fast_vs_hf\": %.3f, \"images\": %d",
                                       n / t.decode, t.parity / t.decode,
                                       (t.decode + t.store) / t.decode, n / t.fast,
                                       t.hf / t.fast, t.images)});
    return true;
  };
  // JPEG at 1 MP also split by encoding: a progressive JPEG's entropy
  // decoding (most of its cost) does not shrink with DCT-domain scaling.
  std::vector<Image> baseline_jpeg, progressive_jpeg;
  for (const Image& im : jpeg) {
    (IsProgressiveJpeg(im.bytes) ? progressive_jpeg : baseline_jpeg).push_back(im);
  }
  const bool ok = vs("decode_jpeg_1mp_vs_hf", jpeg, 1003520) &&
                  vs("decode_jpeg_1mp_baseline_only_vs_hf", baseline_jpeg, 1003520) &&
                  vs("decode_jpeg_1mp_progressive_only_vs_hf", progressive_jpeg, 1003520) &&
                  vs("decode_jpeg_16mp_vs_hf", jpeg, 16777216) &&
                  vs("decode_png_1mp_vs_hf", png, 1003520) &&
                  vs("decode_png_16mp_vs_hf", png, 16777216) &&
                  vs("decode_webp_1mp_vs_hf", webp, 1003520) &&
                  vs("decode_webp_16mp_vs_hf", webp, 16777216);
  if (!ok) return 1;
  if (wanted("decode_scaling_2_cores")) {
    std::fprintf(stderr, "decode_scaling_2_cores ...\n");
    const ScalingResult sc = Scaling(jpeg, 1003520, 2 * seconds);
    rows.push_back(Row{"decode_scaling_2_cores", "images/s", "tutti on 1 core", sc.two, sc.one,
                       absl::StrFormat(", \"cpu_ms_per_image_1\": %.2f, \"cpu_ms_per_image_2\": "
                                       "%.2f, \"cores_given_2\": %.2f",
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
    std::printf("photographs: %s (jpeg %zu: %zu progressive, png %zu, webp %zu); per-core rates are "
                "images per CPU-second of the decoding thread (decode_only: the same codec and DCT "
                "scale without resize or patchify; over_decode_only: tutti's time over it; "
                "store_floor: decode_only plus writing the output bytes alone, over decode_only; "
                "fast: vision.resize RESIZE_FAST), the 2-core case is wall-clock throughput\n",
                photos.c_str(), jpeg.size(), progressive_jpeg.size(), png.size(), webp.size());
  }
  return 0;
}

}  // namespace

TUTTI_COMMAND("bench decode", "benchmark the stager's decode path against HF's preprocessing",
              RunBenchDecode);
