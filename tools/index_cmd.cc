// `tutti index`: builds the packer's index from WebDataset tar shards.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_io.h"
#include "services/packer/bench/synthetic.h"
#include "services/packer/index/index.h"
#include "services/packer/index/index_builder.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/stats.h"

namespace tutti::tools {
namespace {

using packer::IndexBuildOptions;
using packer::IndexBuildProgress;
using packer::IndexBuildReport;

std::string Duration(double s) {
  const int64_t t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? absl::StrFormat("%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60)
                   : absl::StrFormat("%d:%02d", t / 60, t % 60);
}

int WriteIndex(const std::string& out, const std::string& bytes, uint64_t samples) {
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(out).parent_path();
  if (!dir.empty() && !std::filesystem::exists(dir, ec) &&
      !std::filesystem::create_directories(dir, ec)) {
    std::fprintf(stderr, "tutti index: cannot create %s for the index: %s\n", dir.c_str(),
                 ec.message().c_str());
    return 1;
  }
  if (absl::Status s = WriteFileAtomically(out, bytes); !s.ok()) {
    std::fprintf(stderr, "tutti index: cannot write %s: %s\n", out.c_str(),
                 std::string(s.message()).c_str());
    return 1;
  }
  std::printf("wrote %s: %llu samples, %llu bytes (%.1f bytes/sample)\n", out.c_str(),
              static_cast<unsigned long long>(samples),
              static_cast<unsigned long long>(bytes.size()),
              samples ? double(bytes.size()) / samples : 0.0);
  return 0;
}

// What the build found: shards and samples indexed, what was skipped and
// why, bad shards. Printed whether or not an index could be written.
void PrintReport(const IndexBuildReport& report, bool built, double seconds, uint64_t vocab_size) {
  const double s = std::max(1e-6, seconds);
  if (built) {
    std::fprintf(stderr,
                 "indexed %u of %u shards in %.1f s (%.1f MB/s): %llu samples (%llu text-only, %llu "
                 "vision-language; %llu images, %llu audio clips)\n",
                 report.shards_indexed, report.shards_total, s, report.bytes / s / 1e6,
                 static_cast<unsigned long long>(report.samples),
                 static_cast<unsigned long long>(report.text_samples),
                 static_cast<unsigned long long>(report.vl_samples),
                 static_cast<unsigned long long>(report.images),
                 static_cast<unsigned long long>(report.audio));
  }
  if (!report.skipped.empty()) {
    uint64_t total = 0;
    std::string reasons;
    for (const auto& [reason, n] : report.skipped) {
      total += n;
      absl::StrAppend(&reasons, reasons.empty() ? "" : ", ", reason, " ", n);
    }
    std::fprintf(stderr, "skipped %llu corrupt or unusable sample%s: %s\n",
                 static_cast<unsigned long long>(total), total == 1 ? "" : "s", reasons.c_str());
  }
  for (const auto& [reason, n] : report.skipped_members) {
    std::fprintf(stderr, "skipped %llu tar member%s (%s): not regular files\n",
                 static_cast<unsigned long long>(n), n == 1 ? "" : "s", reason.c_str());
  }
  for (const auto& e : report.skipped_examples) std::fprintf(stderr, "  %s\n", e.c_str());
  if (auto it = report.skipped.find("token_out_of_vocab"); it != report.skipped.end()) {
    std::fprintf(
        stderr,
        "%llu %s token ids at or above --vocab-size %llu%s: if the dataset was "
        "tokenised with another vocabulary, pass --vocab-size with that tokenizer's size\n",
        static_cast<unsigned long long>(it->second),
        it->second == 1 ? "sample holds" : "samples hold",
        static_cast<unsigned long long>(vocab_size),
        vocab_size == packer::kDefaultVocabSize ? " (the default, Qwen2-VL's)" : "");
  }
  if (report.unknown_json_members > 0) {
    // Counted, the first few named: a misspelt input_ids shows here.
    std::string fields;
    size_t named = 0;
    for (const auto& [field, n] : report.unknown_json_fields) {
      if (named++ == 8) break;
      absl::StrAppend(&fields, fields.empty() ? "" : ", ", "\"", absl::CHexEscape(field), "\" (", n,
                      ")");
    }
    if (report.unknown_json_fields.size() > 8 || report.unknown_json_other > 0) {
      absl::StrAppend(&fields, " and others");
    }
    std::fprintf(stderr,
                 "warning: %llu k.json member%s carry fields tutti does not know, ignored: %s "
                 "(a sample has input_ids, trained, schema, source and meta, or num_tokens, "
                 "token_count or text to count from; check for a misspelt name)\n",
                 static_cast<unsigned long long>(report.unknown_json_members),
                 report.unknown_json_members == 1 ? "" : "s", fields.c_str());
  }
  if (report.ignored_members > 0) {
    std::fprintf(stderr, "ignored %llu members with extensions the index does not use\n",
                 static_cast<unsigned long long>(report.ignored_members));
  }
  if (!report.bad_shards.empty()) {
    std::fprintf(stderr, "left out %zu bad shard%s (re-copy or rebuild, then re-index):\n",
                 report.bad_shards.size(), report.bad_shards.size() == 1 ? "" : "s");
    for (const auto& b : report.bad_shards) std::fprintf(stderr, "  %s\n", b.c_str());
  }
}

int RunSynthetic(const std::string& out, uint64_t n, uint64_t seed) {
  packer::SyntheticOptions o;
  o.samples = n;
  o.seed = seed;
  const auto t0 = std::chrono::steady_clock::now();
  auto bytes = packer::MakeSyntheticIndex(o);
  if (!bytes.ok()) {
    std::fprintf(stderr, "tutti index: %s\n", std::string(bytes.status().message()).c_str());
    return 1;
  }
  std::fprintf(stderr, "generated %llu synthetic samples in %.1f s\n",
               static_cast<unsigned long long>(n), SecondsSince(t0));
  return WriteIndex(out, *bytes, n);
}

int RunIndex(int argc, char** argv) {
  IndexBuildOptions o;
  std::string out;
  uint64_t synthetic = 0, synthetic_seed = 1;
  Cli cli(
      "tutti index --source DIR --out FILE [options]",
      "Builds the packer's index from the WebDataset .tar shards under DIR (searched\n"
      "recursively) without decoding pixels: image sizes come from JPEG/PNG/WebP headers,\n"
      "audio durations from WAV headers, text token counts from the length of input_ids in\n"
      "k.json (or its num_tokens/token_count field, or its \"text\" length / bytes-per-token),\n"
      "or for k.txt from its byte length / bytes-per-token. Every shard is recorded with its\n"
      "size and crc32c. Corrupt samples are skipped and counted by reason (a member name that\n"
      "is not UTF-8, input_ids that are not token ids, unreadable or oversized images), links\n"
      "inside a shard are counted and not followed; a truncated, corrupt, empty or\n"
      "non-UTF-8-named shard is left out and reported (or fails the command with\n"
      "--noskip-bad-shards). --out's directory is created if missing.");
  cli.Flag("source", &o.source_dir, "directory holding the .tar shards");
  cli.Flag("out", &out, "index file to write (replaced atomically)");
  cli.Flag("threads", &o.threads, "shards read in parallel", 1, 256);
  cli.Flag("skip-bad-shards", &o.skip_bad_shards,
           "leave out truncated/corrupt shards and report them (--noskip-bad-shards: fail)");
  cli.Flag("bytes-per-token", &o.bytes_per_token,
           "bytes per token when estimating from k.txt or a JSON \"text\" field");
  cli.Flag("vocab-size", &o.vocab_size,
           "token ids in k.json's input_ids must be below this: the tokenizer's vocabulary "
           "(the default is Qwen2-VL's, as the job config's default image token ids); a sample "
           "with an id at or above it is skipped (token_out_of_vocab), named",
           1, uint64_t{1} << 31);
  cli.Flag("max-aspect-ratio", &o.max_aspect_ratio,
           "skip samples with an image more elongated than this (vision.max_aspect_ratio)");
  cli.Flag("max-images-per-sample", &o.max_images_per_sample,
           "skip samples with more images than this (vision.max_images_per_sample)", 1, 1024);
  cli.Flag("max-shard-members", &o.max_shard_members,
           "leave out (and report) a shard with more tar members than this", 1, 1u << 24);
  cli.Flag("synthetic", &synthetic,
           "instead of reading shards, write a synthetic index of this many samples (the "
           "benchmark workload; for scale tests; 0 = read shards)",
           0, UINT32_MAX);
  cli.Flag("synthetic-seed", &synthetic_seed, "seed of the synthetic index");
  int rc = 0;
  if (!cli.Parse(argc, argv, &rc)) return rc;
  if (out.empty()) {
    std::fprintf(stderr, "tutti index: --out FILE is required (see --help)\n");
    return 2;
  }
  if (synthetic > 0) return RunSynthetic(out, synthetic, synthetic_seed);
  if (o.source_dir.empty()) {
    std::fprintf(stderr, "tutti index: --source DIR is required (see --help)\n");
    return 2;
  }

  const bool tty = isatty(STDERR_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  auto progress = [&](const IndexBuildProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (!tty || (std::chrono::duration<double>(now - last).count() < 0.2 &&
                 p.shards_done < p.shards_total)) {
      return;
    }
    last = now;
    const double s = std::max(1e-6, SecondsSince(t0));
    const double rate = p.bytes_done / s;
    const double eta =
        rate > 0 ? (p.bytes_total - std::min(p.bytes_total, p.bytes_done)) / rate : 0;
    std::fprintf(stderr, "\r[%u/%u shards] %llu samples  %.1f MB/s  ETA %s   ", p.shards_done,
                 p.shards_total, static_cast<unsigned long long>(p.samples), rate / 1e6,
                 Duration(eta).c_str());
    std::fflush(stderr);
  };
  IndexBuildReport report;
  auto bytes = packer::BuildIndex(o, &report, progress);
  if (tty) std::fprintf(stderr, "\n");
  PrintReport(report, bytes.ok(), SecondsSince(t0), o.vocab_size);
  if (!bytes.ok()) {
    std::fprintf(stderr, "tutti index: %s\n", std::string(bytes.status().message()).c_str());
    return 1;
  }
  return WriteIndex(out, *bytes, report.samples);
}

}  // namespace
}  // namespace tutti::tools

TUTTI_COMMAND("index", "build the packer's index from WebDataset tar shards",
              tutti::tools::RunIndex);
