// `tutti bench decode`: the stager's decode path (DCT-reduced JPEG decode,
// one-pass resize + normalise + patchify) against the path a user would
// write (full cv::imdecode, cv::resize, normalise, patchify as separate
// passes), on real photographs, in one run; and its scaling to two cores.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <opencv2/core.hpp>

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
    if (out.size() >= max) break;
    auto bytes = tutti::ReadFileToString(f);
    if (!bytes.ok()) continue;
    auto h = tutti::ReadImageHeader(*bytes);
    if (!h.ok()) continue;
    out.push_back(Image{f, std::move(*bytes), h->kind, h->width, h->height});
  }
  return out;
}

// Images per second decoding `images` round-robin on `threads` threads for
// about `seconds` (at least one pass).
double Rate(const std::vector<Image>& images, uint64_t max_pixels, bool fused, int threads,
            double seconds) {
  tutti::VisionGeometryOptions geo;
  geo.max_pixels = max_pixels;
  PatchifyParams p;
  std::atomic<uint64_t> done{0};
  std::atomic<bool> failed{false};
  const auto start = std::chrono::steady_clock::now();
  auto work = [&](int t) {
    std::vector<char> out;
    for (size_t i = t;; i += threads) {
      const Image& im = images[i % images.size()];
      auto g = tutti::SmartResize(im.height, im.width, geo);
      if (!g.ok()) continue;
      out.resize(p.ImageBytes(g->height, g->width));
      absl::Status s = fused ? tutti::stager::DecodeImageInto(im.bytes, im.name, im.kind, g->height,
                                                              g->width, p, out.data())
                                   .status()
                             : tutti::stager::NaiveDecodeInto(im.bytes, g->height, g->width, p, out.data());
      if (!s.ok()) failed = true;
      done.fetch_add(1);
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (i + threads >= images.size() && el >= seconds) break;
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back(work, t);
  for (auto& t : ts) t.join();
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return failed ? 0 : done.load() / el;
}

struct Row {
  std::string name, unit, baseline_name;
  double tutti, baseline;
  std::string note;
};

int RunBenchDecode(int argc, char** argv) {
  tutti::tools::Cli cli(
      "tutti bench decode [--photos DIR] [--seconds S] [--json]",
      "Decode + resize + normalise + patchify of real photographs (Debian's wallpaper packages, "
      "fetched by tools/fetch_photos.sh into a cache directory) at max_pixels 1 MP and 16 MP: "
      "tutti's fused path versus the naive separate passes, one core each, in the same run; "
      "then tutti on two cores versus one.");
  std::string photos, fetch = "tools/fetch_photos.sh";
  double seconds = 3;
  uint64_t max_images = 12;
  bool json = false;
  cli.Flag("photos", &photos, "directory with jpeg/, png/, webp/ (empty: run --fetch to get them)");
  cli.Flag("fetch", &fetch, "script that fetches the photographs and prints their directory");
  cli.Flag("seconds", &seconds, "minimum seconds per measurement");
  cli.Flag("max_images", &max_images, "photographs per format (fewer = quicker)");
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
  auto vs = [&](const char* name, const std::vector<Image>& imgs, uint64_t mp) {
    if (imgs.empty()) return;
    std::fprintf(stderr, "%s: %zu images ...\n", name, imgs.size());
    const double naive = Rate(imgs, mp, false, 1, seconds);
    const double fused = Rate(imgs, mp, true, 1, seconds);
    rows.push_back(Row{name, "images/s/core", "naive imdecode+resize+normalise+patchify", fused, naive, ""});
  };
  vs("decode_jpeg_1mp_vs_naive", jpeg, 1003520);
  vs("decode_jpeg_16mp_vs_naive", jpeg, 16777216);
  vs("decode_png_1mp_vs_naive", png, 1003520);
  vs("decode_webp_1mp_vs_naive", webp, 1003520);
  std::fprintf(stderr, "decode_scaling_2_cores ...\n");
  const double one = Rate(jpeg, 1003520, true, 1, seconds);
  const double two = Rate(jpeg, 1003520, true, 2, seconds);
  rows.push_back(Row{"decode_scaling_2_cores", "images/s", "tutti on 1 core", two, one, ""});
  if (json) {
    for (const auto& r : rows) {
      std::printf("{\"case\": \"%s\", \"tutti\": %.3f, \"baseline\": %.3f, \"baseline_name\": \"%s\", "
                  "\"ratio\": %.3f, \"unit\": \"%s\"}\n",
                  r.name.c_str(), r.tutti, r.baseline, r.baseline_name.c_str(),
                  r.baseline > 0 ? r.tutti / r.baseline : 0, r.unit.c_str());
    }
  } else {
    std::printf("%-28s %12s %12s %7s  %-14s %s\n", "case", "tutti", "baseline", "ratio", "unit", "baseline");
    for (const auto& r : rows) {
      std::printf("%-28s %12.2f %12.2f %7.2f  %-14s %s\n", r.name.c_str(), r.tutti, r.baseline,
                  r.baseline > 0 ? r.tutti / r.baseline : 0, r.unit.c_str(), r.baseline_name.c_str());
    }
    std::printf("photographs: %s (jpeg %zu, png %zu, webp %zu)\n", photos.c_str(), jpeg.size(), png.size(),
                webp.size());
  }
  return 0;
}

}  // namespace

TUTTI_COMMAND("bench decode", "benchmark the stager's decode path against the naive one", RunBenchDecode);
