// `tutti bench index`: how fast `tutti index` reads a dataset, on the local
// disk and through tutti-slowfs (a FUSE mount adding latency to every open
// and read, a network file system under load), against the reader that
// reads every header where it lies one read at a time and against the same
// read-ahead reader with one read in flight, all in one run and checked to
// write the same index; and how long an index of 100 M samples takes to load
// and what it holds in memory, on a synthetic index file (no shards behind
// it), in a child process so its memory is its own.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/heap_usage.h"
#include "common/uring_file.h"
#include "services/packer/bench/bench_workload.h"
#include "services/packer/bench/synthetic.h"
#include "services/packer/core/job.h"
#include "services/packer/index/index.h"
#include "services/packer/index/index_builder.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/datagen/dataset_gen.h"
#include "tools/slowfs_mount.h"
#include "tools/stats.h"

namespace tutti::tools {
namespace {

namespace fs = std::filesystem;
using packer::IndexBuildOptions;
using packer::ShardReader;

struct ReadRow {
  std::string fs;      // the file system read from
  size_t kind = 0;     // 0 tutti, 1 the same with one read in flight, 2 per-header
  std::string reader;  // what read
  double seconds = 0;  // median of the rounds
  uint64_t samples = 0;
  uint64_t bytes = 0;
  bool same = true;  // wrote the index the first reader wrote
};

// Builds the index of `source` `rounds` times with `o`; the median time.
// *bytes: the index.
bool TimeBuild(IndexBuildOptions o, const std::string& source, uint32_t rounds, ReadRow* row,
               std::string* bytes) {
  o.source_dir = source;
  std::vector<double> times;
  for (uint32_t r = 0; r < rounds; ++r) {
    packer::IndexBuildReport report;
    const auto t0 = std::chrono::steady_clock::now();
    auto built = packer::BuildIndex(o, &report, nullptr);
    times.push_back(SecondsSince(t0));
    if (!built.ok()) {
      std::fprintf(stderr, "tutti bench index: %s\n",
                   std::string(built.status().message()).c_str());
      return false;
    }
    row->samples = report.samples;
    row->bytes = report.bytes_read;
    *bytes = std::move(*built);
  }
  row->seconds = Quantile(times, 0.5);
  return true;
}

struct LoadResult {
  bool ok = false;
  std::string error;
  double seconds = 0;
  uint64_t samples = 0, file_bytes = 0, heap_bytes = 0, heap_growth = 0;
  uint64_t rss_file = 0, rss_anon = 0;  // growth
  double job_seconds = 0;
  uint64_t job_heap_growth = 0;
};

// RssAnon and RssFile of this process, bytes.
std::pair<uint64_t, uint64_t> Rss() {
  std::ifstream status("/proc/self/status");
  std::string line;
  uint64_t anon = 0, file = 0;
  while (std::getline(status, line)) {
    uint64_t kb = 0;
    if (line.rfind("RssAnon:", 0) == 0) std::istringstream(line.substr(8)) >> kb, anon = kb << 10;
    if (line.rfind("RssFile:", 0) == 0) std::istringstream(line.substr(8)) >> kb, file = kb << 10;
  }
  return {anon, file};
}

// Loads `path` (after dropping its pages from the page cache when `cold`)
// in a child process, and with `job` creates a packer job over it; what it
// measured.
LoadResult MeasureLoad(const std::string& path, bool cold, bool job) {
  if (cold) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ::fdatasync(fd);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  }
  int fds[2];
  LoadResult r;
  if (::pipe(fds) != 0) return r;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    LoadResult c;
    const auto [anon0, file0] = Rss();
    const uint64_t heap0 = HeapInUseBytes();
    const auto t0 = std::chrono::steady_clock::now();
    auto index = packer::LoadIndex(path);
    c.seconds = SecondsSince(t0);
    const auto [anon1, file1] = Rss();
    c.heap_growth = HeapInUseBytes() - heap0;
    c.rss_anon = anon1 - std::min(anon0, anon1);
    c.rss_file = file1 - std::min(file0, file1);
    if (index.ok()) {
      c.ok = true;
      c.samples = (*index)->num_samples();
      c.file_bytes = (*index)->file_bytes();
      c.heap_bytes = (*index)->heap_bytes();
      if (job) {
        packer::SeedWorkloadOptions wo;
        const uint64_t heap1 = HeapInUseBytes();
        const auto t1 = std::chrono::steady_clock::now();
        auto shape = packer::SeedShape(wo, **index, 64, packer::kSeedStage1MaxPixels);
        absl::Status s = shape.status();
        if (shape.ok()) {
          auto created = packer::Job::Create(
              packer::SeedConfig(wo, *shape, 64, packer::kSeedStage1MaxPixels, "tutti", 1, false),
              *index);
          s = created.status();
          c.job_seconds = SecondsSince(t1);
          c.job_heap_growth = HeapInUseBytes() - heap1;
        }
        if (!s.ok()) c.error = std::string(s.message()).substr(0, 200);
      }
    } else {
      c.error = std::string(index.status().message()).substr(0, 200);
    }
    const std::string out =
        absl::StrFormat("%d %.6f %u %u %u %u %u %u %.6f %u\n%s", c.ok, c.seconds, c.samples,
                        c.file_bytes, c.heap_bytes, c.heap_growth, c.rss_file, c.rss_anon,
                        c.job_seconds, c.job_heap_growth, c.error);
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) got.append(buf, n);
  ::close(fds[0]);
  ::waitpid(pid, nullptr, 0);
  std::istringstream in(got);
  int ok = 0;
  in >> ok >> r.seconds >> r.samples >> r.file_bytes >> r.heap_bytes >> r.heap_growth >>
      r.rss_file >> r.rss_anon >> r.job_seconds >> r.job_heap_growth;
  std::getline(in, r.error);
  std::getline(in, r.error);
  r.ok = ok == 1 && r.error.empty();
  if (got.empty()) r.error = "the measuring process died (out of memory?)";
  return r;
}

std::string ReaderName(const IndexBuildOptions& o) {
  if (o.reader == ShardReader::kPerHeader) {
    return absl::StrCat("per-header, ", o.threads, " shard", o.threads == 1 ? "" : "s",
                        ", 1 read in flight each");
  }
  return absl::StrCat("read-ahead, ", o.threads, " shard", o.threads == 1 ? "" : "s", " x ",
                      o.io_depth, " read", o.io_depth == 1 ? "" : "s", " of ", o.read_bytes >> 10,
                      " KiB in flight");
}

int RunBenchIndex(int argc, char** argv) {
  Cli cli("tutti bench index [--dir DIR] [--json] [options]",
          "Samples per second of `tutti index` (its build, in this process, less writing the "
          "file) over a generated WebDataset on the local disk and "
          "through tutti-slowfs (--latency_ms per open and read), side by side: tutti's reader "
          "(each shard front to back, --threads shards x --io_depth reads in flight), the same "
          "reader with one read in flight, and the per-header reader (every tar header, image "
          "header and text member read where it lies, one read at a time, then the shard again "
          "for its checksums: how `tutti index` read before). Every reader must write the same "
          "index. Then the load time and memory of a synthetic index of --load_samples samples "
          "(a file of about 50 bytes a sample, written once under --dir), with its pages dropped "
          "from the page cache first (cold) and cached (warm), and a packer job created over it.");
  std::string dir = "/var/tmp/tutti-bench-index", slowfs;
  uint64_t samples = 2000, load_samples = 100'000'000, read_kb = 1024;
  uint32_t per_shard = 100, rounds = 3, slow_rounds = 3;
  uint32_t threads = packer::DefaultIndexThreads(), io_depth = 8;
  double latency_ms = 2, max_megapixels = 1;
  bool json = false, skip_slowfs = false, skip_load = false, job = true;
  cli.Flag("dir", &dir, "work directory (dataset, mount point, synthetic index)");
  cli.Flag("samples", &samples, "samples in the generated dataset");
  cli.Flag("samples_per_shard", &per_shard, "samples per shard");
  cli.Flag("max_megapixels", &max_megapixels, "largest image of the dataset");
  cli.Flag("rounds", &rounds, "local disk: builds per reader (the median is reported)");
  cli.Flag("slow_rounds", &slow_rounds,
           "slowfs: builds per read-ahead reader (the per-header reader builds once)");
  cli.Flag("latency_ms", &latency_ms, "slowfs: latency of every open and read");
  cli.Flag("threads", &threads, "tutti: shards read at once");
  cli.Flag("io_depth", &io_depth, "tutti: reads in flight per shard");
  cli.Flag("read_kb", &read_kb, "tutti: KiB per read");
  cli.Flag("slowfs", &slowfs, "tutti-slowfs binary (default: next to this tool)");
  cli.Flag("skip_slowfs", &skip_slowfs, "skip the cases that need FUSE");
  cli.Flag("load_samples", &load_samples, "samples of the synthetic index loaded");
  cli.Flag("skip_load", &skip_load, "skip the load measurement");
  cli.Flag("job", &job, "also create a packer job over the loaded index (time, heap)");
  cli.Flag("json", &json, "one JSON object per row instead of tables");
  int rc = 0;
  if (!cli.Parse(argc, argv, &rc)) return rc;
  if (samples == 0 || per_shard == 0 || rounds == 0 || slow_rounds == 0 || threads == 0 ||
      io_depth == 0 || read_kb == 0 || read_kb % 4 != 0 || load_samples == 0) {
    std::fprintf(stderr,
                 "tutti bench index: --samples, --samples_per_shard, --rounds, --slow_rounds, "
                 "--threads, --io_depth and --load_samples must be at least 1, --read_kb a "
                 "multiple of 4\n");
    return 2;
  }
  fs::create_directories(dir);

  // The dataset, written once and kept for later runs.
  const std::string src = absl::StrCat(dir, "/src-", samples, "x", per_shard, "-", max_megapixels);
  if (!fs::exists(src + "/done")) {
    std::fprintf(stderr, "writing %llu samples to %s ...\n",
                 static_cast<unsigned long long>(samples), src.c_str());
    fs::remove_all(src);
    datagen::GenDatasetOptions g;
    g.out_dir = src;
    g.samples = samples;
    g.samples_per_shard = per_shard;
    g.max_megapixels = max_megapixels;
    auto written = datagen::GenerateDataset(g);
    if (!written.ok()) {
      std::fprintf(stderr, "tutti bench index: %s\n",
                   std::string(written.status().message()).c_str());
      return 1;
    }
    std::ofstream(src + "/done") << "ok\n";
  }

  IndexBuildOptions tutti_o;
  tutti_o.threads = threads;
  tutti_o.io_depth = io_depth;
  tutti_o.read_bytes = read_kb << 10;
  IndexBuildOptions one = tutti_o;
  one.threads = 1;
  one.io_depth = 1;
  IndexBuildOptions per_header = tutti_o;
  per_header.reader = ShardReader::kPerHeader;
  per_header.threads = 1;
  const IndexBuildOptions* readers[] = {&tutti_o, &one, &per_header};

  std::vector<ReadRow> rows;
  bool same = true;
  // The readers over one file system; each must write the first one's index.
  auto run_fs = [&](const std::string& fs_name, const std::string& source, uint32_t n,
                    uint32_t n_per_header) {
    std::string first;
    for (size_t k = 0; k < 3; ++k) {
      ReadRow row;
      row.fs = fs_name;
      row.kind = k;
      row.reader = ReaderName(*readers[k]);
      std::fprintf(stderr, "%s: %s ...\n", fs_name.c_str(), row.reader.c_str());
      std::string bytes;
      if (!TimeBuild(*readers[k], source, k == 2 ? n_per_header : n, &row, &bytes)) return false;
      if (k == 0) first = bytes;
      row.same = bytes == first;
      same &= row.same;
      rows.push_back(row);
    }
    return true;
  };
  if (!run_fs("local disk", src, rounds, rounds)) return 1;
  if (!skip_slowfs) {
    SlowfsMount mount(SlowfsBinary(slowfs), src, dir + "/mnt", latency_ms);
    if (mount.ok() &&
        !run_fs(absl::StrFormat("slowfs %g ms/op", latency_ms), dir + "/mnt", slow_rounds, 1)) {
      return 1;
    }
  }

  LoadResult cold, warm;
  if (!skip_load) {
    const std::string path = absl::StrCat(dir, "/synthetic-", load_samples, ".idx");
    if (!fs::exists(path)) {
      std::fprintf(stderr, "writing a synthetic index of %llu samples to %s ...\n",
                   static_cast<unsigned long long>(load_samples), path.c_str());
      packer::SyntheticOptions so;
      so.samples = load_samples;
      if (absl::Status s = packer::WriteSyntheticIndex(so, path); !s.ok()) {
        std::fprintf(stderr, "tutti bench index: %s\n", std::string(s.message()).c_str());
        return 1;
      }
    }
    std::fprintf(stderr, "loading it, pages dropped from the cache ...\n");
    cold = MeasureLoad(path, /*cold=*/true, /*job=*/false);
    std::fprintf(stderr, "loading it again, cached%s ...\n", job ? ", and creating a job" : "");
    warm = MeasureLoad(path, /*cold=*/false, job);
    for (const LoadResult* r : {&cold, &warm}) {
      if (!r->error.empty()) std::fprintf(stderr, "tutti bench index: %s\n", r->error.c_str());
    }
  }

  // The row's file system's time for reader `kind`.
  auto baseline = [&](const ReadRow& r, size_t kind) {
    for (const ReadRow& b : rows) {
      if (b.fs == r.fs && b.kind == kind) return b.seconds;
    }
    return 0.0;
  };
  if (json) {
    for (const ReadRow& r : rows) {
      const double ph = baseline(r, 2), one_s = baseline(r, 1);
      std::printf(
          "{\"case\": \"index_read\", \"fs\": \"%s\", \"reader\": \"%s\", \"samples\": %llu, "
          "\"bytes\": %llu, \"seconds\": %.4f, \"samples_per_s\": %.1f, \"mb_per_s\": %.1f, "
          "\"vs_per_header\": %.2f, \"vs_one_in_flight\": %.2f, \"same_index\": %s}\n",
          r.fs.c_str(), r.reader.c_str(), static_cast<unsigned long long>(r.samples),
          static_cast<unsigned long long>(r.bytes), r.seconds, r.samples / r.seconds,
          r.bytes / r.seconds / 1e6, ph / r.seconds, one_s / r.seconds, r.same ? "true" : "false");
    }
    for (const auto& [name, r] : {std::pair{"cold", &cold}, std::pair{"warm", &warm}}) {
      if (skip_load) break;
      std::printf(
          "{\"case\": \"index_load\", \"cache\": \"%s\", \"ok\": %s, \"samples\": %llu, "
          "\"file_bytes\": %llu, \"seconds\": %.3f, \"rss_file_bytes\": %llu, "
          "\"rss_anon_bytes\": %llu, \"heap_growth_bytes\": %llu, \"heap_bytes\": %llu, "
          "\"job_seconds\": %.3f, \"job_heap_growth_bytes\": %llu}\n",
          name, r->ok ? "true" : "false", static_cast<unsigned long long>(r->samples),
          static_cast<unsigned long long>(r->file_bytes), r->seconds,
          static_cast<unsigned long long>(r->rss_file),
          static_cast<unsigned long long>(r->rss_anon),
          static_cast<unsigned long long>(r->heap_growth),
          static_cast<unsigned long long>(r->heap_bytes), r->job_seconds,
          static_cast<unsigned long long>(r->job_heap_growth));
    }
    return same ? 0 : 1;
  }
  std::printf("%-16s %-44s %9s %11s %9s %12s %12s\n", "file system", "reader", "seconds",
              "samples/s", "MB/s", "vs per-hdr", "vs 1 read");
  for (const ReadRow& r : rows) {
    const double ph = baseline(r, 2), one_s = baseline(r, 1);
    std::printf("%-16s %-44s %9.3f %11.0f %9.1f %11.1fx %11.1fx\n", r.fs.c_str(), r.reader.c_str(),
                r.seconds, r.samples / r.seconds, r.bytes / r.seconds / 1e6, ph / r.seconds,
                one_s / r.seconds);
  }
  std::printf("every reader wrote the same index: %s\n", same ? "yes" : "NO");
  if (!skip_load) {
    std::printf("\nindex of %llu samples, %.2f GB (%.1f bytes/sample):\n",
                static_cast<unsigned long long>(cold.samples), cold.file_bytes / 1e9,
                cold.samples ? double(cold.file_bytes) / cold.samples : 0.0);
    std::printf("%-26s %9s %13s %13s %13s %13s\n", "load", "seconds", "RSS file MB", "RSS anon MB",
                "heap MB", "heap B/sample");
    for (const auto& [name, r] :
         {std::pair{"cold (pages not cached)", &cold}, std::pair{"warm (pages cached)", &warm}}) {
      std::printf("%-26s %9.2f %13.1f %13.1f %13.2f %13.4f\n", name, r->seconds, r->rss_file / 1e6,
                  r->rss_anon / 1e6, r->heap_growth / 1e6,
                  r->samples ? double(r->heap_growth) / r->samples : 0.0);
    }
    if (job && warm.ok) {
      std::printf(
          "packer job over it (Job::Create, 64 ranks): %.2f s, heap %.1f MB (%.2f "
          "B/sample)\n",
          warm.job_seconds, warm.job_heap_growth / 1e6,
          warm.samples ? double(warm.job_heap_growth) / warm.samples : 0.0);
    }
  }
  return same && (skip_load || (cold.ok && warm.ok)) ? 0 : 1;
}

}  // namespace
}  // namespace tutti::tools

TUTTI_COMMAND("bench index",
              "benchmark `tutti index` (local disk and slowfs, against a per-header reader) "
              "and the load of a 100 M-sample index",
              tutti::tools::RunBenchIndex);
