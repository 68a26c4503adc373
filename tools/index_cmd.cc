// `tutti index`: builds the packer's index from WebDataset tar shards.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_io.h"
#include "common/sample_json.h"
#include "common/uring_file.h"
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

// Creates the directory that will hold `out`; false (printed) when it cannot.
bool MakeOutDir(const std::string& out) {
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(out).parent_path();
  if (!dir.empty() && !std::filesystem::exists(dir, ec) &&
      !std::filesystem::create_directories(dir, ec)) {
    std::fprintf(stderr, "tutti index: cannot create %s for the index: %s\n", dir.c_str(),
                 ec.message().c_str());
    return false;
  }
  return true;
}

void PrintWritten(const std::string& out, uint64_t samples) {
  std::error_code ec;
  const uint64_t bytes = std::filesystem::file_size(out, ec);
  std::printf("wrote %s: %llu samples, %llu bytes (%.1f bytes/sample)\n", out.c_str(),
              static_cast<unsigned long long>(samples), static_cast<unsigned long long>(bytes),
              samples ? double(bytes) / samples : 0.0);
}

// What the build found: shards and samples indexed, what was skipped and
// why, bad shards. Printed whether or not an index could be written.
void PrintReport(const IndexBuildReport& report, bool built, double seconds, uint64_t vocab_size) {
  const double s = std::max(1e-6, seconds);
  if (built) {
    std::fprintf(
        stderr,
        "indexed %u of %u shards in %.1f s (%.1f MB/s read): %llu samples (%llu text-only, %llu "
        "vision-language; %llu images, %llu audio clips)\n",
        report.shards_indexed, report.shards_total, s, report.bytes_read / s / 1e6,
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
  if (!MakeOutDir(out)) return 1;
  if (absl::Status s = packer::WriteSyntheticIndex(o, out); !s.ok()) {
    std::fprintf(stderr, "tutti index: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::fprintf(stderr, "generated %llu synthetic samples in %.1f s\n",
               static_cast<unsigned long long>(n), SecondsSince(t0));
  PrintWritten(out, n);
  return 0;
}

// The progress line: on a terminal rewritten in place five times a second,
// elsewhere (a log) a line every 10 seconds.
class ProgressLine {
 public:
  ProgressLine() : tty_(isatty(STDERR_FILENO)), t0_(std::chrono::steady_clock::now()), last_(t0_) {}
  void operator()(const IndexBuildProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (first_) {
      first_ = false;
      base_samples_ = p.samples;  // reused from the previous index, not read now
    }
    const bool end = p.shards_done >= p.shards_total;
    if (std::chrono::duration<double>(now - last_).count() < (tty_ ? 0.2 : 10.0) && !end) return;
    if (!tty_ && end) return;  // the summary follows
    last_ = now;
    const double s = std::max(1e-6, SecondsSince(t0_));
    const double bytes_rate = p.bytes_done / s;
    const double eta =
        bytes_rate > 0 ? (p.bytes_total - std::min(p.bytes_total, p.bytes_done)) / bytes_rate : 0;
    std::fprintf(stderr, "%s[%u/%u shards] %llu samples  %.0f samples/s  %.1f MB/s  ETA %s%s",
                 tty_ ? "\r" : "", p.shards_done, p.shards_total,
                 static_cast<unsigned long long>(p.samples), (p.samples - base_samples_) / s,
                 bytes_rate / 1e6, Duration(eta).c_str(), tty_ ? "   " : "\n");
    std::fflush(stderr);
    printed_ = true;
  }
  // Ends the line on a terminal.
  void Finish() {
    if (tty_ && printed_) std::fprintf(stderr, "\n");
  }

 private:
  const bool tty_;
  const std::chrono::steady_clock::time_point t0_;
  std::chrono::steady_clock::time_point last_;
  bool first_ = true;
  bool printed_ = false;
  uint64_t base_samples_ = 0;
};

// The previous index at `out` for an incremental build (null: none, or
// one that cannot be read, said why on stderr).
std::shared_ptr<const packer::Index> Previous(const std::string& out, bool append) {
  std::error_code ec;
  if (!std::filesystem::exists(out, ec)) return nullptr;
  auto prev = packer::LoadIndex(out);
  if (!prev.ok()) {
    if (!append) {
      std::fprintf(stderr, "not reusing %s (%s): reading every shard\n", out.c_str(),
                   std::string(prev.status().message()).c_str());
    }
    return nullptr;
  }
  return *prev;
}

int RunIndex(int argc, char** argv) {
  IndexBuildOptions o;
  std::string out, reader = "readahead", io_backend = "auto";
  uint64_t synthetic = 0, synthetic_seed = 1, read_kb = o.read_bytes >> 10;
  bool full = false;
  Cli cli(
      "tutti index --source DIR --out FILE [options]",
      "Builds the packer's index from the WebDataset .tar shards under DIR (searched\n"
      "recursively) without decoding pixels: image sizes come from JPEG/PNG/WebP headers,\n"
      "audio durations from WAV headers, text token counts from the length of input_ids in\n"
      "k.json (or its num_tokens/token_count field, or its \"text\" length / bytes-per-token),\n"
      "or for k.txt from its byte length / bytes-per-token. Every shard is recorded with its\n"
      "size, modification time and crc32c, every member with its crc32c. Corrupt samples are\n"
      "skipped and counted by reason (a member name that is not UTF-8, input_ids that are not\n"
      "token ids, unreadable or oversized images), links inside a shard are counted and not\n"
      "followed; a truncated, corrupt, empty or non-UTF-8-named shard is left out and reported\n"
      "(or fails the command with --noskip-bad-shards). --out's directory is created if\n"
      "missing.\n"
      "Shards are read --threads at a time, each front to back in --read-kb reads with\n"
      "--io-depth of them in flight (io_uring where the kernel allows it), so a network file\n"
      "system's latency is paid per read, not per tar header. When --out already holds an index\n"
      "of DIR built with the same options, only shards that are new or changed (size or\n"
      "modification time) are read, and what it recorded of the others is reused: the result\n"
      "is the same file a full build writes. --append also refuses any change that would\n"
      "renumber the indexed samples (a changed or removed shard, a new one sorting among them).");
  cli.Flag("source", &o.source_dir, "directory holding the .tar shards");
  cli.Flag("out", &out, "index file to write (replaced atomically)");
  cli.Flag("threads", &o.threads, "shards read at once", 1, 256);
  cli.Flag("io-depth", &o.io_depth, "reads in flight per shard", 1, 1024);
  cli.Flag("read-kb", &read_kb, "KiB per read (a multiple of 4)", 4, uint64_t{1} << 20);
  cli.Flag("io-backend", &io_backend,
           "auto (io_uring where the kernel allows it), uring, or pread (a thread pool)");
  cli.Flag("reader", &reader,
           "readahead (each shard front to back, --io-depth reads in flight), or per-header "
           "(every header read where it lies, one read at a time, then the shard again for its "
           "checksums: the baseline of `tutti bench index`)");
  cli.Flag("full", &full, "read every shard, even when --out holds an index to reuse");
  cli.Flag("append", &o.append,
           "add the new shards to the index at --out; fail if an indexed shard changed or went, "
           "or a new one sorts before an indexed one (sample ids would change)");
  cli.Flag("skip-bad-shards", &o.skip_bad_shards,
           "leave out truncated/corrupt shards and report them (--noskip-bad-shards: fail)");
  cli.Flag("bytes-per-token", &o.bytes_per_token,
           "bytes per token when estimating from k.txt or a JSON \"text\" field");
  cli.Flag("vocab-size", &o.vocab_size,
           "token ids in k.json's input_ids must be below this: the tokenizer's vocabulary "
           "(default: the dataset's tutti_dataset.json tokenizer.vocab_size, else Qwen2-VL's, "
           "as the job config's default image token ids); a sample with an id at or above it "
           "is skipped (token_out_of_vocab), named",
           1, uint64_t{1} << 31);
  cli.Flag("image-placeholder-id", &o.image_placeholder_id,
           "the id that stands for each image in a schema-2 k.json (default: the dataset's "
           "tutti_dataset.json placeholders.image; -1 and no manifest: none)");
  cli.Flag("audio-placeholder-id", &o.audio_placeholder_id,
           "the id that stands for each audio clip in a schema-2 k.json (default: the "
           "manifest's placeholders.audio)");
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
  bool vocab_given = false;  // else the dataset's manifest may give it
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    vocab_given |= arg == "--vocab-size" || absl::StartsWith(arg, "--vocab-size=");
  }
  if (out.empty()) {
    std::fprintf(stderr, "tutti index: --out FILE is required (see --help)\n");
    return 2;
  }
  // The dataset's manifest (`tutti convert` writes one) gives what the flags leave unset.
  if (const std::string path = o.source_dir + "/" + kDatasetManifestName;
      !o.source_dir.empty() && std::filesystem::exists(path)) {
    auto text = ReadFileToString(path);
    auto m = text.ok() ? ParseDatasetManifest(*text) : text.status();
    if (!m.ok()) {
      std::fprintf(stderr, "tutti index: %s: %s (rewrite it with tutti convert, or remove it)\n",
                   path.c_str(), std::string(m.status().message()).c_str());
      return 2;
    }
    if (o.image_placeholder_id < 0) o.image_placeholder_id = m->image_placeholder_id;
    if (o.audio_placeholder_id < 0) o.audio_placeholder_id = m->audio_placeholder_id;
    if (!vocab_given && m->vocab_size > 0) o.vocab_size = m->vocab_size;
  }
  if (read_kb % 4 != 0) {
    std::fprintf(stderr, "tutti index: --read-kb must be a multiple of 4\n");
    return 2;
  }
  // Every shard read at once holds --io-depth reads of --read-kb in flight.
  if (uint64_t{o.threads} * o.io_depth * read_kb > (uint64_t{4} << 20)) {
    std::fprintf(stderr,
                 "tutti index: --threads %u x --io-depth %u x --read-kb %llu is more than 4G of "
                 "read buffers; lower one of them\n",
                 o.threads, o.io_depth, static_cast<unsigned long long>(read_kb));
    return 2;
  }
  o.read_bytes = read_kb << 10;
  if (reader == "readahead" || reader == "per-header") {
    o.reader =
        reader == "readahead" ? packer::ShardReader::kReadAhead : packer::ShardReader::kPerHeader;
  } else {
    std::fprintf(stderr, "tutti index: --reader is readahead or per-header, not '%s'\n",
                 reader.c_str());
    return 2;
  }
  auto backend = ParseIoBackendChoice(io_backend);
  if (!backend.ok()) {
    std::fprintf(stderr, "tutti index: --io-backend: %s\n",
                 std::string(backend.status().message()).c_str());
    return 2;
  }
  o.io_backend = *backend;
  if (full && o.append) {
    std::fprintf(stderr, "tutti index: --full reads every shard; --append reuses the index\n");
    return 2;
  }
  if (synthetic > 0) return RunSynthetic(out, synthetic, synthetic_seed);
  if (o.source_dir.empty()) {
    std::fprintf(stderr, "tutti index: --source DIR is required (see --help)\n");
    return 2;
  }
  if (!MakeOutDir(out)) return 1;
  if (!full) o.previous = Previous(out, o.append);

  const auto t0 = std::chrono::steady_clock::now();
  ProgressLine line;
  IndexBuildReport report;
  absl::Status built =
      packer::BuildIndexFile(o, out, &report, [&line](const IndexBuildProgress& p) { line(p); });
  line.Finish();
  o.previous.reset();  // unmapped: the new file replaced it
  if (!report.not_incremental.empty()) {
    std::fprintf(stderr, "not reusing %s (%s): reading every shard\n", out.c_str(),
                 report.not_incremental.c_str());
  } else if (report.shards_reused > 0 || report.shards_removed > 0) {
    std::fprintf(stderr,
                 "reused %u unchanged shards from %s, read %u new or changed, dropped %u "
                 "removed\n",
                 report.shards_reused, out.c_str(), report.shards_read, report.shards_removed);
  }
  PrintReport(report, built.ok(), SecondsSince(t0), o.vocab_size);
  if (!built.ok()) {
    std::fprintf(stderr, "tutti index: %s\n", std::string(built.message()).c_str());
    return 1;
  }
  PrintWritten(out, report.samples);
  return 0;
}

}  // namespace
}  // namespace tutti::tools

TUTTI_COMMAND("index", "build the packer's index from WebDataset tar shards",
              tutti::tools::RunIndex);
