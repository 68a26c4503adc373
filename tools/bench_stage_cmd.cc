// `tutti bench stage`: the stager's io_uring staging against `cp -r` and
// fio's sequential-write bandwidth on the same disk (large shards), and
// against `cp -r` from a remote-file-system emulator (many small files with
// a per-operation latency), each measured in the same run.
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/stager/cache.h"
#include "services/stager/staging.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int Sh(const std::string& cmd) { return std::system(cmd.c_str()); }

std::string ShOut(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

// Writes `count` files of `bytes` random-ish bytes under dir (kept if present).
std::vector<tutti::v1::ShardRef> MakeFiles(const std::string& dir, int count, uint64_t bytes,
                                           const char* pattern) {
  fs::create_directories(dir);
  std::vector<tutti::v1::ShardRef> refs;
  std::string block(1 << 20, '\0');
  std::mt19937_64 rng(42);
  for (auto& c : block) c = static_cast<char>(rng());
  for (int i = 0; i < count; ++i) {
    const std::string name = absl::StrFormat(pattern, i);
    const std::string path = dir + "/" + name;
    if (!fs::exists(path) || fs::file_size(path) != bytes) {
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      for (uint64_t done = 0; done < bytes;) {
        const uint64_t n = std::min<uint64_t>(block.size(), bytes - done);
        block[0] = static_cast<char>(i);  // files differ
        f.write(block.data(), static_cast<std::streamsize>(n));
        done += n;
      }
    }
    tutti::v1::ShardRef ref;
    ref.set_name(name);
    ref.set_size(bytes);
    refs.push_back(ref);
  }
  return refs;
}

// Stages refs from src into a fresh cache dir; returns seconds (or -1).
double Stage(const std::string& src, const std::string& cache_dir,
             const std::vector<tutti::v1::ShardRef>& refs, unsigned depth, size_t block,
             unsigned max_files) {
  fs::remove_all(cache_dir);
  tutti::stager::ShardCache cache(cache_dir, 0);
  if (!cache.Open().ok()) return -1;
  tutti::stager::StagingOptions o;
  o.source_dir = src;
  o.queue_depth = depth;
  o.block_size = block;
  o.max_files = max_files;
  tutti::stager::StagingEngine engine(o, &cache, nullptr);
  absl::Status s = engine.Start();
  if (!s.ok()) {
    std::fprintf(stderr, "staging: %s\n", std::string(s.message()).c_str());
    return -1;
  }
  std::vector<std::string> names;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < refs.size(); ++i) {
    engine.Request(refs[i], i);
    names.push_back(refs[i].name());
  }
  s = engine.Wait(names, absl::Now() + absl::Hours(1));
  const double secs = Since(t0);
  if (!s.ok()) {
    std::fprintf(stderr, "staging: %s\n", std::string(s.message()).c_str());
    return -1;
  }
  return secs;
}

// `cp -r src dst` followed by syncing the copies (so the data is on disk, as tutti's is).
double CopyWithCp(const std::string& src, const std::string& dst) {
  fs::remove_all(dst);
  const auto t0 = Clock::now();
  if (Sh(absl::StrCat("cp -r '", src, "' '", dst, "' && sync -f '", dst, "'")) != 0) return -1;
  return Since(t0);
}

// fio sequential write bandwidth (bytes/s) of `bytes` in `dir`, O_DIRECT, with a final fsync.
double FioWrite(const std::string& dir, uint64_t bytes) {
  const std::string file = dir + "/fio.dat";
  const std::string out = ShOut(absl::StrCat(
      "fio --name=seqwrite --filename='", file, "' --rw=write --bs=1M --size=", bytes,
      " --direct=1 --ioengine=io_uring --iodepth=32 --end_fsync=1 --output-format=json 2>/dev/null"));
  fs::remove(file);
  const size_t w = out.find("\"write\" : {");
  const size_t k = out.find("\"bw_bytes\"", w == std::string::npos ? 0 : w);
  if (w == std::string::npos || k == std::string::npos) return -1;
  return std::atof(out.c_str() + out.find(':', k) + 1);
}

struct Row {
  std::string name, unit, baseline_name;
  double tutti, baseline;
};

std::string SlowfsBinary(const std::string& given) {
  if (!given.empty()) return given;
  const fs::path self = fs::read_symlink("/proc/self/exe");
  for (auto p : {self.parent_path() / "slowfs" / "tutti-slowfs", self.parent_path() / "tutti-slowfs"}) {
    if (fs::exists(p)) return p.string();
  }
  return "tutti-slowfs";
}

int RunBenchStage(int argc, char** argv) {
  tutti::tools::Cli cli(
      "tutti bench stage [--dir DIR] [--json] [size options]",
      "Staging throughput: large shards versus cp -r and fio's sequential write on the same disk; "
      "many small files from tutti-slowfs (a FUSE mount adding latency to every operation) "
      "versus cp -r from the same mount. Baselines run in the same invocation.");
  std::string dir = "/var/tmp/tutti-bench-stage", slowfs;
  uint32_t large_files = 16, large_mb = 64, small_files = 10000, small_kb = 64, depth = 64;
  uint32_t max_files = 32;
  uint64_t block_kb = 1024;
  double latency_ms = 2;
  bool json = false, skip_small = false;
  cli.Flag("dir", &dir, "work directory on the disk under test (source, cache, copies)");
  cli.Flag("large_files", &large_files, "large shards");
  cli.Flag("large_mb", &large_mb, "MiB per large shard");
  cli.Flag("small_files", &small_files, "small files behind the emulator");
  cli.Flag("small_kb", &small_kb, "KiB per small file");
  cli.Flag("latency_ms", &latency_ms, "emulated latency per open/read");
  cli.Flag("queue_depth", &depth, "tutti: operations in flight");
  cli.Flag("block_kb", &block_kb, "tutti: block size in KiB for large shards");
  cli.Flag("max_files", &max_files, "tutti: files in flight");
  cli.Flag("slowfs", &slowfs, "tutti-slowfs binary (default: next to this tool)");
  cli.Flag("skip_small", &skip_small, "skip the small-file case (no FUSE)");
  cli.Flag("json", &json, "one JSON object per case instead of a table");
  int rc;
  if (!cli.Parse(argc, argv, &rc)) return rc;
  fs::create_directories(dir);
  std::vector<Row> rows;
  // Large shards.
  const uint64_t large = uint64_t{large_mb} << 20;
  std::fprintf(stderr, "writing %u x %u MiB source shards ...\n", large_files, large_mb);
  auto refs = MakeFiles(dir + "/src-large", static_cast<int>(large_files), large, "shard-%05d.tar");
  const double total = static_cast<double>(large) * large_files;
  std::fprintf(stderr, "fio sequential write ...\n");
  const double fio = FioWrite(dir, static_cast<uint64_t>(total));
  std::fprintf(stderr, "tutti staging (io_uring, O_DIRECT, depth %u, %llu KiB blocks) ...\n", depth,
               static_cast<unsigned long long>(block_kb));
  const double t_large = Stage(dir + "/src-large", dir + "/cache-large", refs, depth, block_kb << 10, max_files);
  fs::remove_all(dir + "/cache-large");
  std::fprintf(stderr, "cp -r + sync ...\n");
  const double c_large = CopyWithCp(dir + "/src-large", dir + "/cp-large");
  fs::remove_all(dir + "/cp-large");
  const double mib = 1 << 20;
  rows.push_back(Row{"stage_large_vs_fio", "MiB/s", "fio seq write (direct, iodepth 32, end_fsync)",
                     t_large > 0 ? total / t_large / mib : 0, fio > 0 ? fio / mib : 0});
  rows.push_back(Row{"stage_large_vs_cp", "MiB/s", "cp -r then sync",
                     t_large > 0 ? total / t_large / mib : 0, c_large > 0 ? total / c_large / mib : 0});
  // Small files behind the emulator.
  if (!skip_small) {
    std::fprintf(stderr, "writing %u x %u KiB files ...\n", small_files, small_kb);
    auto small = MakeFiles(dir + "/src-small", static_cast<int>(small_files), uint64_t{small_kb} << 10,
                           "f%06d.bin");
    const std::string mnt = dir + "/mnt";
    fs::create_directories(mnt);
    Sh(absl::StrCat("fusermount3 -u -q '", mnt, "' 2>/dev/null"));
    const std::string bin = SlowfsBinary(slowfs);
    pid_t pid = ::fork();
    if (pid == 0) {
      const std::string lat = absl::StrCat("--latency_ms=", latency_ms);
      const std::string src = dir + "/src-small";
      std::freopen("/dev/null", "w", stdout);  // keep --json output clean
      ::execl(bin.c_str(), "tutti-slowfs", src.c_str(), mnt.c_str(), lat.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    bool mounted = false;
    for (int i = 0; i < 200 && !mounted; ++i) {
      ::usleep(20000);
      mounted = ShOut("grep -c ' " + mnt + " ' /proc/mounts").find('1') == 0;
    }
    if (!mounted) {
      std::fprintf(stderr, "tutti bench stage: could not mount %s with %s; skipping the small-file case\n",
                   mnt.c_str(), bin.c_str());
    } else {
      std::fprintf(stderr, "tutti staging from the emulator (%g ms per operation) ...\n", latency_ms);
      const double t_small = Stage(mnt, dir + "/cache-small", small, depth, 64 << 10, depth);
      fs::remove_all(dir + "/cache-small");
      std::fprintf(stderr, "cp -r from the emulator + sync ...\n");
      const double c_small = CopyWithCp(mnt, dir + "/cp-small");
      fs::remove_all(dir + "/cp-small");
      rows.push_back(Row{"stage_small_remote_vs_cp", "files/s", "cp -r then sync, same mount",
                         t_small > 0 ? small_files / t_small : 0, c_small > 0 ? small_files / c_small : 0});
    }
    ::kill(pid, SIGTERM);
    ::waitpid(pid, nullptr, 0);
    Sh(absl::StrCat("fusermount3 -u -q '", mnt, "' 2>/dev/null"));
  }
  for (const auto& r : rows) {
    const double ratio = r.baseline > 0 ? r.tutti / r.baseline : 0;
    if (json) {
      std::printf("{\"case\": \"%s\", \"tutti\": %.3f, \"baseline\": %.3f, \"baseline_name\": \"%s\", "
                  "\"ratio\": %.3f, \"unit\": \"%s\"}\n",
                  r.name.c_str(), r.tutti, r.baseline, r.baseline_name.c_str(), ratio, r.unit.c_str());
    }
  }
  if (!json) {
    std::printf("%-26s %12s %12s %7s  %-8s %s\n", "case", "tutti", "baseline", "ratio", "unit", "baseline");
    for (const auto& r : rows) {
      std::printf("%-26s %12.1f %12.1f %7.2f  %-8s %s\n", r.name.c_str(), r.tutti, r.baseline,
                  r.baseline > 0 ? r.tutti / r.baseline : 0, r.unit.c_str(), r.baseline_name.c_str());
    }
  }
  return 0;
}

}  // namespace

TUTTI_COMMAND("bench stage", "benchmark staging against cp -r and fio", RunBenchStage);
