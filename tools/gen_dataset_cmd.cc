// `tutti gen-dataset`: writes a synthetic WebDataset for trying tutti out and
// for benchmarks (see tools/datagen/dataset_gen.h for the format).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <opencv2/core.hpp>
#include <string>

#include "absl/strings/str_format.h"
#include "common/byte_size.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/datagen/dataset_gen.h"

namespace {

using tutti::datagen::GenDatasetOptions;

std::string Duration(double s) {
  if (s < 60) return absl::StrFormat("%.0fs", s);
  if (s < 3600) return absl::StrFormat("%dm%02ds", int(s) / 60, int(s) % 60);
  return absl::StrFormat("%dh%02dm", int(s) / 3600, int(s) % 3600 / 60);
}

int RunGenDataset(int argc, char** argv) {
  GenDatasetOptions o;
  uint32_t jpeg_quality = o.encode.jpeg_quality, webp_quality = o.encode.webp_quality,
           png_compression = o.encode.png_compression;
  bool quiet = false;
  tutti::tools::Cli cli(
      "tutti gen-dataset --out DIR [options]",
      "Writes a synthetic WebDataset: tar shards (shard-000000.tar, ...) of samples that are\n"
      "text-only or carry 1-4 real JPEG/PNG/WebP images (gradients, shapes, rendered text,\n"
      "noise) at the resolution mix of a VLM training set (90% up to 2 MP, 10% up to 16 MP),\n"
      "optional 16 kHz PCM16 WAV audio, and pre-tokenised text in <key>.json\n"
      "({\"input_ids\": [...]}, ids below 151640). Members: <key>.json, <key>.<i>.jpg|png|webp,\n"
      "<key>.wav. The same --seed always writes byte-identical shards, whatever --threads.\n"
      "Large images are slow to encode: use --max-megapixels 2 for a quick start.");
  cli.Flag("out", &o.out_dir, "output directory (created; must be empty unless --force)");
  cli.Flag("samples", &o.samples, "number of samples");
  cli.Flag("samples-per-shard", &o.samples_per_shard, "samples per tar shard");
  cli.Flag("text-fraction", &o.text_fraction, "fraction of samples without images");
  cli.Flag("audio-fraction", &o.audio_fraction,
           "fraction of samples that also carry <key>.wav (1-30 s), drawn independently");
  cli.Flag("large-fraction", &o.large_fraction, "fraction of images between 2 and 16 MP");
  cli.Flag("max-megapixels", &o.max_megapixels,
           "cap on any image's area; larger draws land in [cap/2, cap]");
  cli.Flag("formats", &o.formats, "image formats with weights, e.g. jpg:7,png:2,webp:1");
  cli.Flag("seed", &o.seed, "random seed; the dataset is a pure function of it and the options");
  cli.Flag("threads", &o.threads, "encoder threads (0 = all cores)");
  cli.Flag("text-tokens-median", &o.text_tokens_median,
           "median text tokens of a text-only sample (log-normal)");
  cli.Flag("vl-text-tokens-median", &o.vl_text_tokens_median,
           "median text tokens of a sample with images (log-normal)");
  cli.Flag("text-tokens-sigma", &o.text_tokens_sigma, "log-space sigma of text tokens per sample");
  cli.Flag("max-text-tokens", &o.max_text_tokens, "largest text length in tokens");
  cli.Flag("jpeg-quality", &jpeg_quality, "JPEG quality 0-100");
  cli.Flag("webp-quality", &webp_quality, "WebP quality 1-100");
  cli.Flag("png-compression", &png_compression, "PNG zlib level 0-9");
  cli.Flag("force", &o.force, "write into a non-empty --out, replacing its shard-*.tar files");
  cli.Flag("quiet", &quiet, "no progress line");
  int rc = 0;
  if (!cli.Parse(argc, argv, &rc)) return rc;
  if (!cli.positional().empty()) {
    std::fprintf(stderr, "tutti gen-dataset: unexpected argument '%s' (see --help)\n",
                 cli.positional()[0].c_str());
    return 2;
  }
  o.encode.jpeg_quality = static_cast<int>(jpeg_quality);
  o.encode.webp_quality = static_cast<int>(webp_quality);
  o.encode.png_compression = static_cast<int>(png_compression);
  // Parallelism comes from the sample workers; keep OpenCV from adding its own.
  cv::setNumThreads(1);

  const bool tty = ::isatty(STDERR_FILENO);
  auto last = std::chrono::steady_clock::now() - std::chrono::hours(1);
  auto progress = [&](const tutti::datagen::GenProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    const bool done = p.samples_done == p.samples_total;
    if (quiet || (!done && now - last < std::chrono::milliseconds(tty ? 250 : 5000))) return;
    last = now;
    const double rate = p.samples_done / std::max(1e-9, p.elapsed_seconds);
    const double eta = (p.samples_total - p.samples_done) / std::max(1e-9, rate);
    std::fprintf(stderr,
                 "%sgen-dataset: %llu/%llu samples, %llu/%llu shards, %s, %.1f samples/s, ETA %s%s",
                 tty ? "\r" : "", static_cast<unsigned long long>(p.samples_done),
                 static_cast<unsigned long long>(p.samples_total),
                 static_cast<unsigned long long>(p.shards_done),
                 static_cast<unsigned long long>(p.shards_total),
                 tutti::FormatBytes(p.bytes_written).c_str(), rate, Duration(eta).c_str(),
                 tty && !done ? "   " : "\n");
    std::fflush(stderr);
  };
  auto stats = tutti::datagen::GenerateDataset(o, progress);
  if (!stats.ok()) {
    if (tty && !quiet) std::fprintf(stderr, "\n");
    std::fprintf(stderr, "tutti gen-dataset: %s\n", std::string(stats.status().message()).c_str());
    return 1;
  }
  const auto& s = *stats;
  std::printf("wrote %zu shards, %s, to %s in %s\n", s.shards.size(),
              tutti::FormatBytes(s.bytes).c_str(), o.out_dir.c_str(),
              Duration(s.elapsed_seconds).c_str());
  std::printf("  samples        %llu (text-only %llu, with images %llu, with audio %llu)\n",
              static_cast<unsigned long long>(s.samples),
              static_cast<unsigned long long>(s.text_only),
              static_cast<unsigned long long>(s.with_images),
              static_cast<unsigned long long>(s.with_audio));
  std::printf("  images         %llu (jpeg %llu, png %llu, webp %llu; above 2 MP %llu)\n",
              static_cast<unsigned long long>(s.images),
              static_cast<unsigned long long>(s.images_by_kind[1]),
              static_cast<unsigned long long>(s.images_by_kind[2]),
              static_cast<unsigned long long>(s.images_by_kind[3]),
              static_cast<unsigned long long>(s.large_images));
  std::printf("  megapixels     %.1f total, %.2f mean, %.2f largest\n", s.image_megapixels,
              s.images ? s.image_megapixels / s.images : 0.0, s.max_image_megapixels);
  std::printf("  text tokens    %llu (%.0f per sample)\n",
              static_cast<unsigned long long>(s.text_tokens),
              static_cast<double>(s.text_tokens) / std::max<uint64_t>(1, s.samples));
  if (s.with_audio) std::printf("  audio          %.1f s\n", s.audio_ms / 1000.0);
  return 0;
}

}  // namespace

TUTTI_COMMAND("gen-dataset", "write a synthetic WebDataset (text, images, audio) for trying tutti",
              RunGenDataset);
