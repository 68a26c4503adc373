// `tutti bench stage`: the stager's io_uring staging against fio's sequential
// write bandwidth and `cp -r` on the same disk (large shards, alternated in
// rounds), against `cp -r` from a remote-file-system emulator (many small
// files with a per-operation latency), and the prefetch window against a
// stalled read (a consumer's wait per batch versus the sample deadline), and
// the steps a job takes with one shard whose every read stalls versus with
// none (io_uring and pread), each measured in the same run.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "services/stager/stager_core.h"
#include "services/stager/staging/cache.h"
#include "services/stager/staging/staging.h"
#include "services/stager/test_dataset.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/slowfs_mount.h"

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

// Writes `count` files of `bytes` pseudo-random bytes under dir (kept when
// already there) and returns their refs with CRC-32C, as an index has them,
// so staging verifies every byte as it does in production.
std::vector<tutti::v1::ShardRef> MakeFiles(const std::string& dir, int count, uint64_t bytes,
                                           const absl::FormatSpec<int>& pattern) {
  fs::create_directories(dir);
  std::vector<tutti::v1::ShardRef> refs;
  std::string block(1 << 20, '\0');
  std::mt19937_64 rng(42);
  for (auto& c : block) c = static_cast<char>(rng());
  for (int i = 0; i < count; ++i) {
    const std::string name = absl::StrFormat(pattern, i);
    const std::string path = dir + "/" + name;
    uint32_t crc = 0;
    const bool have = fs::exists(path) && fs::file_size(path) == bytes;
    std::ofstream f;
    if (!have) f.open(path, std::ios::binary | std::ios::trunc);
    for (uint64_t done = 0; done < bytes;) {
      const uint64_t n = std::min<uint64_t>(block.size(), bytes - done);
      block[0] = static_cast<char>(i);  // files differ
      if (!have) f.write(block.data(), static_cast<std::streamsize>(n));
      crc = tutti::Crc32cExtend(crc, block.data(), n);
      done += n;
    }
    tutti::v1::ShardRef ref;
    ref.set_name(name);
    ref.set_size(bytes);
    ref.set_crc32c(crc);
    refs.push_back(ref);
  }
  return refs;
}

// Stages refs from src into cache_dir (which must not exist); returns seconds (or -1).
double Stage(const std::string& src, const std::string& cache_dir,
             const std::vector<tutti::v1::ShardRef>& refs, unsigned depth, size_t block,
             unsigned max_files) {
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
  const auto t0 = Clock::now();
  if (Sh(absl::StrCat("cp -r '", src, "' '", dst, "' && sync -f '", dst, "'")) != 0) return -1;
  return Since(t0);
}

// fio sequential write of `bytes` to a new file in `dir`, O_DIRECT, with a
// final fsync; returns seconds (or -1).
double FioWrite(const std::string& dir, uint64_t bytes) {
  const std::string file = dir + "/fio.dat";
  fs::remove(file);
  const std::string out = ShOut(absl::StrCat(
      "fio --name=seqwrite --filename='", file, "' --rw=write --bs=1M --size=", bytes,
      " --direct=1 --ioengine=io_uring --iodepth=32 --end_fsync=1 --output-format=json 2>/dev/null"));
  fs::remove(file);
  const size_t w = out.find("\"write\" : {");
  const size_t k = out.find("\"bw_bytes\"", w == std::string::npos ? 0 : w);
  if (w == std::string::npos || k == std::string::npos) return -1;
  const double bw = std::atof(out.c_str() + out.find(':', k) + 1);
  return bw > 0 ? static_cast<double>(bytes) / bw : -1;
}

using tutti::tools::SlowfsBinary;
using Emulator = tutti::tools::SlowfsMount;

struct Row {
  std::string name, unit, baseline_name;
  double tutti, baseline;
  std::string extra;  // more JSON fields, ", \"k\": v" each
};

// A consumer takes one batch per local rank every `interval_ms` while one
// image in 1,000 stalls forever behind the emulator; returns the row.
struct PrefetchOptions {
  int samples = 1000;
  int per_rank = 8;
  uint32_t interval_ms = 100;
  uint32_t deadline_ms = 500;
  uint32_t window = 4;
  double latency_ms = 2;
  bool verbose = false;  // print every skipped sample
};

bool Prefetch(const std::string& dir, const std::string& slowfs, const PrefetchOptions& po, Row* row) {
  namespace st = tutti::stager;
  const std::string src = dir + "/src-prefetch";
  fs::remove_all(src);
  auto data = st::testing::WriteDataset(
      src, {.shards = 4, .samples_per_shard = po.samples / 4, .width = 320, .height = 240});
  // One image in 1,000 stalls forever (a byte range of its shard).
  std::vector<std::string> stalls;
  std::vector<uint64_t> stalled_ids;
  for (size_t id = 500; id < data.samples.size(); id += 1000) {
    const auto& m = data.samples[id].images(0);
    stalls.push_back(absl::StrCat(data.shards[data.samples[id].shard()].name(), "@", m.offset(), "+",
                                  m.size()));
    stalled_ids.push_back(id);
  }
  Emulator emu(SlowfsBinary(slowfs), src, dir + "/mnt-prefetch", po.latency_ms, stalls);
  if (!emu.ok()) return false;
  const uint32_t ranks = 2;
  tutti::v1::JobInfo job = st::testing::MakeJob(data, ranks, ranks);
  job.mutable_config()->set_job_id("bench-prefetch");
  st::StagerOptions o;
  o.cache_dir = dir + "/cache-prefetch-" + std::to_string(::getpid());
  o.staging.source_dir = dir + "/mnt-prefetch";
  o.staging.queue_depth = 32;
  o.staging.block_size = 1 << 20;
  o.sample_deadline_ms = po.deadline_ms;
  o.stage_wait_ms = po.deadline_ms / 4;
  o.window = po.window;
  o.stage_ahead = 2 * po.window;
  o.decode_threads = 2;
  auto metrics = std::make_shared<st::StagerMetrics>(std::make_shared<prometheus::Registry>());
  const uint64_t steps = data.samples.size() / (ranks * po.per_rank);
  std::vector<double> waits;
  int lost = 0, skipped = 0, placeholders = 0;
  std::string first_error;
  {
    st::StagerCore core(o, metrics);
    if (absl::Status s = core.Start(job); !s.ok()) {
      std::fprintf(stderr, "prefetch: %s\n", std::string(s.message()).c_str());
      return false;
    }
    std::thread feeder([&] {
      for (uint64_t s = 0; s < steps; ++s) {
        if (!core.AddPlan(st::testing::MakePlan(data, job, s, {}, po.per_rank), 0).ok()) return;
      }
    });
    for (uint64_t s = 0; s < steps; ++s) {
      const auto step_start = Clock::now();
      for (uint32_t r = 0; r < ranks; ++r) {
        const auto t0 = Clock::now();
        auto d = core.Acquire(s, r, 60000);
        waits.push_back(Since(t0) * 1e3);
        if (!d.ok()) {
          ++lost;
          if (first_error.empty()) first_error = std::string(d.status().message());
          continue;
        }
        for (const auto& sk : d->skipped()) {
          ++skipped;
          placeholders += sk.action() == "placeholder";
          if (po.verbose) {
            std::fprintf(stderr, "step %llu rank %u skipped sample %llu (%s, %s): %s\n",
                         static_cast<unsigned long long>(s), r,
                         static_cast<unsigned long long>(sk.sample_id()), sk.reason().c_str(),
                         sk.action().c_str(), sk.detail().c_str());
          }
        }
        (void)core.Release(s, r);
      }
      std::this_thread::sleep_until(step_start + std::chrono::milliseconds(po.interval_ms));
    }
    core.Stop();
    feeder.join();
  }
  fs::remove_all(o.cache_dir);
  if (!first_error.empty()) std::fprintf(stderr, "prefetch: a step was lost: %s\n", first_error.c_str());
  double worst = 0, sum = 0;
  for (double w : waits) {
    worst = std::max(worst, w);
    sum += w;
  }
  row->name = "prefetch_stall_wait_vs_deadline";
  row->unit = "ms";
  row->baseline_name = "sample deadline; tutti = deadline - worst wait per batch";
  row->baseline = po.deadline_ms;
  row->tutti = po.deadline_ms - worst;
  row->extra = absl::StrFormat(
      ", \"worst_wait_ms\": %.3f, \"mean_wait_ms\": %.3f, \"batches\": %d, \"lost_steps\": %d, "
      "\"stalled_images\": %d, \"skipped\": %d, \"placeholders\": %d, \"interval_ms\": %u",
      worst, waits.empty() ? 0 : sum / waits.size(), static_cast<int>(waits.size()), lost,
      static_cast<int>(stalled_ids.size()), skipped, placeholders, po.interval_ms);
  return true;
}

// Two ranks take `steps` steps as fast as the stager serves them from a
// 4-shard dataset behind the emulator, once with shard 0's every read
// stalling forever and once without; the row compares steps/s. Healthy
// samples skipped (should be 0) and the stalled shard's are counted.
struct StalledShardOptions {
  uint32_t steps = 120;
  int per_rank = 8;
  uint32_t deadline_ms = 1000;
  double latency_ms = 2;
};

bool StalledShard(const std::string& dir, const std::string& slowfs, bool uring,
                  const StalledShardOptions& so, Row* row) {
  namespace st = tutti::stager;
  const std::string src = dir + "/src-stalled";
  fs::remove_all(src);
  auto data = st::testing::WriteDataset(
      src, {.shards = 4, .samples_per_shard = 100, .width = 320, .height = 240});
  const uint32_t ranks = 2;
  tutti::v1::JobInfo job = st::testing::MakeJob(data, ranks, ranks);
  job.mutable_config()->set_job_id(uring ? "bench-stalled-uring" : "bench-stalled-pread");
  struct Run {
    double seconds = 0, worst_ms = 0;
    int lost = 0, healthy_skipped = 0, stalled_skipped = 0;
    double stuck = 0, refusals = 0;
  };
  auto run = [&](bool stall, Run* out) {
    const std::string mnt = dir + (stall ? "/mnt-stalled" : "/mnt-healthy");
    std::vector<std::string> stalls;
    if (stall) stalls.push_back(data.shards[0].name());
    Emulator emu(SlowfsBinary(slowfs), src, mnt, so.latency_ms, stalls);
    if (!emu.ok()) return false;
    st::StagerOptions o;
    o.io_backend = uring ? tutti::IoBackendChoice::kUring : tutti::IoBackendChoice::kPread;
    o.cache_dir = absl::StrCat(dir, "/cache-stalled-", ::getpid());
    fs::remove_all(o.cache_dir);
    o.staging.source_dir = mnt;
    o.staging.block_size = 64 << 10;  // a shard is more blocks than the queue is deep
    o.sample_deadline_ms = so.deadline_ms;
    o.window = 4;
    o.stage_ahead = 8;
    o.decode_threads = 2;
    auto metrics = std::make_shared<st::StagerMetrics>(std::make_shared<prometheus::Registry>());
    {
      st::StagerCore core(o, metrics);
      if (absl::Status s = core.Start(job); !s.ok()) {
        std::fprintf(stderr, "stalled shard: %s\n", std::string(s.message()).c_str());
        return false;
      }
      std::thread feeder([&] {
        for (uint32_t s = 0; s < so.steps; ++s) {
          if (!core.AddPlan(st::testing::MakePlan(data, job, s, {}, so.per_rank), 0).ok()) return;
        }
      });
      const auto t0 = Clock::now();
      for (uint32_t s = 0; s < so.steps; ++s) {
        for (uint32_t r = 0; r < ranks; ++r) {
          const auto w0 = Clock::now();
          auto d = core.Acquire(s, r, 60000);
          out->worst_ms = std::max(out->worst_ms, Since(w0) * 1e3);
          if (!d.ok()) {
            ++out->lost;
            continue;
          }
          for (const auto& sk : d->skipped()) {
            (data.samples[sk.sample_id()].shard() == 0 ? out->stalled_skipped
                                                       : out->healthy_skipped)++;
          }
          (void)core.Release(s, r);
        }
      }
      out->seconds = Since(t0);
      out->stuck = metrics->IoStalledOperations("staging").Value() +
                   metrics->IoStalledOperations("source").Value();
      out->refusals = metrics->IoStalledRefusals("source").Value();
      core.Stop();
      feeder.join();
    }
    fs::remove_all(o.cache_dir);
    return true;
  };
  Run healthy, stalled;
  if (!run(false, &healthy) || !run(true, &stalled)) return false;
  row->name = uring ? "stalled_shard_steps_vs_none_uring" : "stalled_shard_steps_vs_none_pread";
  row->unit = "steps/s";
  row->baseline_name = "the same steps without the stall";
  row->tutti = so.steps / std::max(1e-9, stalled.seconds);
  row->baseline = so.steps / std::max(1e-9, healthy.seconds);
  row->extra = absl::StrFormat(
      ", \"steps\": %u, \"healthy_members_skipped\": %d, \"stalled_members_skipped\": %d, "
      "\"lost_steps\": %d, "
      "\"worst_wait_ms\": %.1f, \"worst_wait_ms_without\": %.1f, \"stuck_ops\": %.0f, "
      "\"refused_reads\": %.0f, \"members_skipped_without\": %d",
      so.steps, stalled.healthy_skipped, stalled.stalled_skipped, stalled.lost, stalled.worst_ms,
      healthy.worst_ms, stalled.stuck, stalled.refusals,
      healthy.healthy_skipped + healthy.stalled_skipped);
  return true;
}

int RunBenchStage(int argc, char** argv) {
  tutti::tools::Cli cli(
      "tutti bench stage [--dir DIR] [--json] [--cases TEXT] [size options]",
      "Staging throughput: large shards versus fio's sequential write (O_DIRECT, end fsync) and "
      "cp -r on the same disk, alternated in rounds; many small files from tutti-slowfs (a FUSE "
      "mount adding latency to every open and read) versus cp -r from the same mount; and a "
      "consumer taking a batch every --interval_ms while one image in 1,000 stalls forever "
      "(prefetch_stall_wait_vs_deadline: tutti = sample deadline minus the worst wait per "
      "batch, so a ratio above 0 means every batch came before the deadline); and two ranks "
      "taking --stalled_steps steps with one of four shards stalling every read versus none "
      "(stalled_shard_steps_vs_none_uring / _pread: steps/s, healthy samples skipped). "
      "Baselines run in the same invocation. Shards carry CRC-32C, so staging verifies every "
      "byte.");
  std::string dir = "/var/tmp/tutti-bench-stage", slowfs, only;
  uint32_t large_files = 16, large_mb = 64, small_files = 10000, small_kb = 64, depth = 64;
  uint32_t max_files = 32, rounds = 5, small_depth = 128, small_in_flight = 128;
  uint64_t block_kb = 1024;
  double latency_ms = 2;
  bool json = false, skip_small = false;
  PrefetchOptions po;
  StalledShardOptions so;
  cli.Flag("dir", &dir, "work directory on the disk under test (source, cache, copies)");
  cli.Flag("large_files", &large_files, "large shards");
  cli.Flag("large_mb", &large_mb, "MiB per large shard");
  cli.Flag("rounds", &rounds, "large shards: rounds of fio, tutti and cp, in rotating order");
  cli.Flag("small_files", &small_files, "small files behind the emulator");
  cli.Flag("small_kb", &small_kb, "KiB per small file");
  cli.Flag("latency_ms", &latency_ms, "emulated latency per open/read");
  cli.Flag("queue_depth", &depth, "tutti: operations in flight for large shards");
  cli.Flag("block_kb", &block_kb, "tutti: block size in KiB for large shards");
  cli.Flag("max_files", &max_files, "tutti: large shards in flight");
  cli.Flag("small_queue_depth", &small_depth, "tutti: operations in flight for small files");
  cli.Flag("small_max_files", &small_in_flight, "tutti: small files in flight");
  cli.Flag("interval_ms", &po.interval_ms, "prefetch: the consumer takes a batch this often");
  cli.Flag("deadline_ms", &po.deadline_ms, "prefetch: per-sample read+decode deadline");
  cli.Flag("window", &po.window, "prefetch: steps of batches kept ready ahead");
  cli.Flag("verbose", &po.verbose, "prefetch: print every skipped sample");
  cli.Flag("stalled_steps", &so.steps, "stalled shard: steps the two ranks take");
  cli.Flag("slowfs", &slowfs, "tutti-slowfs binary (default: next to this tool)");
  cli.Flag("skip_small", &skip_small, "skip the cases that need FUSE");
  cli.Flag("cases", &only, "run only cases whose name contains this text (empty = all)");
  cli.Flag("json", &json, "one JSON object per case instead of a table");
  int rc;
  if (!cli.Parse(argc, argv, &rc)) return rc;
  fs::create_directories(dir);
  auto wanted = [&](const std::string& name) { return name.find(only) != std::string::npos; };
  std::vector<Row> rows;
  const double mib = 1 << 20;
  if (wanted("stage_large_vs_fio") || wanted("stage_large_vs_cp")) {
    const uint64_t large = uint64_t{large_mb} << 20;
    const double total = static_cast<double>(large) * large_files;
    std::fprintf(stderr, "writing %u x %u MiB source shards ...\n", large_files, large_mb);
    const std::string src = absl::StrCat(dir, "/src-large-", large_files, "x", large_mb);
    auto refs = MakeFiles(src, static_cast<int>(large_files), large, "shard-%05d.tar");
    double t_fio = 0, t_tutti = 0, t_cp = 0;
    bool failed = false;
    for (uint32_t r = 0; r < rounds && !failed; ++r) {
      for (uint32_t k = 0; k < 3; ++k) {
        // Let the previous run's deletions (discards, journal) settle first,
        // so no contender starts behind another's clean-up.
        Sh(absl::StrCat("sync -f '", dir, "'"));
        ::sleep(1);
        const std::string target = absl::StrCat(dir, "/large-", ::getpid(), "-", r);
        switch ((r + k) % 3) {
          case 0: {
            std::fprintf(stderr, "round %u: fio sequential write ...\n", r + 1);
            const double t = FioWrite(dir, static_cast<uint64_t>(total));
            failed |= t < 0;
            t_fio += t;
            std::fprintf(stderr, "  fio %.0f MiB/s\n", total / t / mib);
            break;
          }
          case 1: {
            std::fprintf(stderr, "round %u: tutti staging (depth %u, %llu KiB blocks) ...\n", r + 1,
                         depth, static_cast<unsigned long long>(block_kb));
            const double t = Stage(src, target + "-tutti", refs, depth, block_kb << 10, max_files);
            failed |= t < 0;
            t_tutti += t;
            std::fprintf(stderr, "  tutti %.0f MiB/s\n", total / t / mib);
            fs::remove_all(target + "-tutti");
            break;
          }
          default: {
            std::fprintf(stderr, "round %u: cp -r + sync ...\n", r + 1);
            const double t = CopyWithCp(src, target + "-cp");
            failed |= t < 0;
            t_cp += t;
            std::fprintf(stderr, "  cp %.0f MiB/s\n", total / t / mib);
            fs::remove_all(target + "-cp");
            break;
          }
        }
      }
    }
    if (failed) {
      std::fprintf(stderr, "tutti bench stage: a large-shard run failed (is fio installed?)\n");
    } else {
      const double bytes = total * rounds;
      rows.push_back(Row{"stage_large_vs_fio", "MiB/s", "fio seq write (direct, iodepth 32, end_fsync)",
                         bytes / t_tutti / mib, bytes / t_fio / mib, ""});
      rows.push_back(Row{"stage_large_vs_cp", "MiB/s", "cp -r then sync", bytes / t_tutti / mib,
                         bytes / t_cp / mib, ""});
    }
  }
  if (!skip_small && wanted("stage_small_remote_vs_cp")) {
    std::fprintf(stderr, "writing %u x %u KiB files ...\n", small_files, small_kb);
    const std::string src = absl::StrCat(dir, "/src-small-", small_files, "x", small_kb);
    auto small = MakeFiles(src, static_cast<int>(small_files), uint64_t{small_kb} << 10, "f%06d.bin");
    Emulator emu(SlowfsBinary(slowfs), src, dir + "/mnt", latency_ms);
    if (emu.ok()) {
      // Neither copy is deleted before the other ran: creating files right
      // after deleting thousands makes ext4's inode allocator crawl.
      const std::string tutti_dst = absl::StrCat(dir, "/small-", ::getpid(), "-tutti");
      const std::string cp_dst = absl::StrCat(dir, "/small-", ::getpid(), "-cp");
      std::fprintf(stderr, "tutti staging from the emulator (%g ms per open/read) ...\n", latency_ms);
      const double t_small = Stage(dir + "/mnt", tutti_dst, small, small_depth, 64 << 10, small_in_flight);
      std::fprintf(stderr, "cp -r from the emulator + sync ...\n");
      const double c_small = CopyWithCp(dir + "/mnt", cp_dst);
      fs::remove_all(tutti_dst);
      fs::remove_all(cp_dst);
      rows.push_back(Row{"stage_small_remote_vs_cp", "files/s", "cp -r then sync, same mount",
                         t_small > 0 ? small_files / t_small : 0, c_small > 0 ? small_files / c_small : 0,
                         ""});
    }
  }
  if (!skip_small && wanted("prefetch_stall_wait_vs_deadline")) {
    std::fprintf(stderr, "prefetch: a batch every %u ms, one image in 1,000 stalls forever ...\n",
                 po.interval_ms);
    po.latency_ms = latency_ms;
    Row row;
    if (Prefetch(dir, slowfs, po, &row)) rows.push_back(row);
  }
  for (const bool uring : {true, false}) {
    const std::string name =
        uring ? "stalled_shard_steps_vs_none_uring" : "stalled_shard_steps_vs_none_pread";
    if (skip_small || !wanted(name)) continue;
    if (uring && !tutti::ResolveIoBackend(tutti::IoBackendChoice::kUring).ok()) continue;
    std::fprintf(stderr,
                 "stalled shard (%s): %u steps with one of four shards stalled, then none ...\n",
                 uring ? "io_uring" : "pread", so.steps);
    so.latency_ms = latency_ms;
    Row row;
    if (StalledShard(dir, slowfs, uring, so, &row)) rows.push_back(row);
  }
  for (const auto& r : rows) {
    const double ratio = r.baseline > 0 ? r.tutti / r.baseline : 0;
    if (json) {
      std::printf("{\"case\": \"%s\", \"tutti\": %.3f, \"baseline\": %.3f, \"baseline_name\": \"%s\", "
                  "\"ratio\": %.3f, \"unit\": \"%s\"%s}\n",
                  r.name.c_str(), r.tutti, r.baseline, r.baseline_name.c_str(), ratio, r.unit.c_str(),
                  r.extra.c_str());
    }
  }
  if (!json) {
    std::printf("%-32s %12s %12s %7s  %-8s %s\n", "case", "tutti", "baseline", "ratio", "unit", "baseline");
    for (const auto& r : rows) {
      std::printf("%-32s %12.1f %12.1f %7.2f  %-8s %s\n", r.name.c_str(), r.tutti, r.baseline,
                  r.baseline > 0 ? r.tutti / r.baseline : 0, r.unit.c_str(), r.baseline_name.c_str());
      if (!r.extra.empty()) std::printf("%32s %s\n", "", r.extra.c_str() + 2);
    }
  }
  return 0;
}

}  // namespace

TUTTI_COMMAND("bench stage", "benchmark staging against fio and cp -r, and the prefetch window",
              RunBenchStage);
