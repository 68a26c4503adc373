// `tutti stage`: warms a node's cache before a job starts. Copies the
// index's shards from the source into a cache directory with the stager's
// own staging engine (io_uring or pread; checksums verified, partial files
// never visible), in index order, showing progress, so that the job's first
// steps find them on local NVMe. A shard whose source stops answering is
// given up after --staging-timeout-ms, named, while the others are copied;
// the command always finishes. The cache directory is the one tutti-stagerd
// will use (--cache); a directory a running daemon holds is refused.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "common/uring_file.h"
#include "services/packer/index/index.h"
#include "services/stager/staging/cache.h"
#include "services/stager/staging/staging.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/stats.h"

namespace tutti::tools {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "tutti stage: %s\n", message.c_str());
  return 1;
}

int RunStage(int argc, char** argv) {
  std::string index_path, cache_dir, source, capacity_text = "0", block_text = "1M";
  std::string resolve_text = "auto", backend_text = "auto";
  uint32_t first = 0, queue_depth = 64, max_files = 32, file_ops = 4;
  uint32_t timeout_ms = 30000, progress_s = 10;
  bool direct = true, quiet = false;
  Cli cli("tutti stage --index FILE --cache DIR [options]",
          "Warms a node's cache before a job: copies the index's shards from the source\n"
          "directory into the cache directory tutti-stagerd will use (--cache), in index order,\n"
          "with the stager's io_uring staging engine: many blocks in flight, CRC-32C checked\n"
          "against the index, written under a partial name, fsync'd and renamed, so a shard in\n"
          "the cache is always whole. Shards already cached are kept. Stops adding shards when\n"
          "the next would not fit --capacity (nothing is evicted). A shard whose source stops\n"
          "answering is given up after --staging-timeout-ms while the others are copied.\n"
          "Exits 0 when every shard it took on is cached, 1 when any failed (each is named\n"
          "with the reason).");
  cli.Flag("index", &index_path, "index file written by `tutti index`");
  cli.Flag("cache", &cache_dir, "node-local cache directory (the daemon's --cache)");
  cli.Flag("source", &source, "dataset directory (default: the one the index was built from)");
  cli.Flag("capacity", &capacity_text,
           "bytes the cache may hold, e.g. 500G (0 = no limit); shards beyond it are left out");
  cli.Flag("first", &first, "stage only the first N shards of the index (0 = all)");
  cli.Flag("queue-depth", &queue_depth, "reads and writes in flight", 1, 4096);
  cli.Flag("block-size", &block_text, "bytes per read/write, a multiple of 4K (e.g. 1M)");
  cli.Flag("max-files", &max_files, "shards copied at the same time", 1, 4096);
  cli.Flag("source-file-ops", &file_ops,
           "reads of one shard in flight, stuck ones included: what a file that stops answering "
           "can hold of the buffers and workers",
           1, 1024);
  cli.Flag("staging-timeout-ms", &timeout_ms,
           "one read or write; a shard whose source does not answer within it is given up "
           "(named) while the others are copied",
           100, 3600000);
  cli.Flag("io-backend", &backend_text,
           "uring (io_uring), pread (a thread pool) or auto (io_uring where the kernel lets this "
           "process set up a ring, else pread)");
  cli.Flag("progress-s", &progress_s,
           "seconds between progress lines when stderr is not a terminal (0: the summary only); "
           "on a terminal the line is updated every second",
           0, 86400);
  cli.Flag("direct", &direct, "O_DIRECT writes into the cache (--nodirect: page cache)");
  cli.Flag("quiet", &quiet, "no progress line");
  cli.Flag("path-resolve", &resolve_text,
           "how shards are opened beneath the source and the cache, never through a symlink or "
           "'..' out of them: auto (openat2 RESOLVE_BENEATH where the kernel has it, else a "
           "checked walk), openat2 or walk");
  int rc;
  if (!cli.Parse(argc, argv, &rc)) return rc;
  if (index_path.empty() || cache_dir.empty()) {
    return Fail("--index and --cache are required (see --help)");
  }
  uint64_t capacity = 0, block = 0;
  if (!ParseByteSize(capacity_text, &capacity)) {
    return Fail(absl::StrCat("--capacity '", capacity_text, "' is not a size (e.g. 500G, 0)"));
  }
  if (!ParseByteSize(block_text, &block) || block == 0 || block % 4096 != 0 ||
      block > stager::kMaxStagingBlock) {
    return Fail(absl::StrCat("--block-size '", block_text,
                             "' must be a multiple of 4K up to 64M (e.g. 1M)"));
  }
  if (uint64_t{queue_depth} * block > stager::kMaxStagingBuffers) {
    return Fail(absl::StrCat("--queue-depth ", queue_depth, " x --block-size ", block_text,
                             " is more than 4G of staging buffers; lower one of them"));
  }
  absl::StatusOr<IoBackendChoice> backend = ParseIoBackendChoice(backend_text);
  if (!backend.ok()) return Fail(std::string(backend.status().message()));
  absl::StatusOr<bool> uring = ResolveIoBackend(*backend);
  if (!uring.ok()) return Fail(std::string(uring.status().message()));
  absl::StatusOr<ResolveMode> resolve = ParseResolveMode(resolve_text);
  if (!resolve.ok()) return Fail(std::string(resolve.status().message()));

  auto index = packer::LoadIndex(index_path);
  if (!index.ok()) return Fail(std::string(index.status().message()));
  if (source.empty()) source = (*index)->source_dir();
  if (source.empty()) {
    return Fail(absl::StrCat(index_path, " does not record its source directory; pass --source"));
  }

  // The shards to take on: index order, as many as fit.
  std::vector<v1::ShardRef> refs;
  uint64_t total = 0;
  uint32_t left_out = 0;
  for (const packer::IndexShard& s : (*index)->shards()) {
    if (first != 0 && refs.size() + left_out >= first) break;
    if (capacity != 0 && total + s.size > capacity) {
      ++left_out;
      continue;
    }
    v1::ShardRef& r = refs.emplace_back();
    r.set_name(s.name);
    r.set_size(s.size);
    r.set_crc32c(s.crc32c);
    total += s.size;
  }

  stager::ShardCache cache(cache_dir, capacity, *resolve);
  if (absl::Status s = cache.Open(); !s.ok()) return Fail(std::string(s.message()));
  stager::StagingOptions o;
  o.source_dir = source;
  o.queue_depth = queue_depth;
  o.block_size = block;
  o.max_files = max_files;
  o.file_queue_depth = file_ops;
  o.op_timeout = absl::Milliseconds(timeout_ms);
  o.use_io_uring = *uring;
  o.o_direct = direct;
  o.resolve = *resolve;
  stager::StagingEngine engine(o, &cache, nullptr);
  if (absl::Status s = engine.Start(); !s.ok()) return Fail(std::string(s.message()));

  uint32_t cached_before = 0;
  uint64_t bytes_before = 0;
  for (const v1::ShardRef& r : refs) {
    if (cache.Has(r.name(), r.size())) ++cached_before, bytes_before += r.size();
  }
  std::fprintf(stderr, "staging %zu shards (%s) from %s into %s; %u already cached%s\n",
               refs.size(), FormatBytes(total).c_str(), source.c_str(), cache_dir.c_str(),
               cached_before,
               left_out ? absl::StrCat("; ", left_out, " left out (over --capacity)").c_str() : "");
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> names;
  for (size_t i = 0; i < refs.size(); ++i) {
    engine.Request(refs[i], i);
    names.push_back(refs[i].name());
  }

  // Progress until every shard is staged or failed: on a terminal a line
  // updated every second, else one every --progress-s seconds; either names
  // a shard that has made no progress for a while.
  const bool tty = !quiet && ::isatty(STDERR_FILENO);
  const absl::Duration every = tty ? absl::Seconds(1) : absl::Seconds(progress_s);
  const bool periodic = !quiet && progress_s > 0;
  absl::Time next_line = absl::Now() + every;
  std::map<std::string, std::pair<uint64_t, absl::Time>>
      moved;  // shard -> (bytes, when they changed)
  uint32_t staged = 0, failed = 0;
  uint64_t staged_bytes = 0;
  for (;;) {
    staged = failed = 0;
    staged_bytes = 0;
    uint64_t copying = 0;
    std::vector<std::string> pending;
    std::string slowest;
    absl::Duration still = absl::ZeroDuration();
    const absl::Time now = absl::Now();
    for (const v1::ShardRef& r : refs) {
      const stager::ShardStatusInfo st = engine.Status(r.name());
      if (st.state == stager::ShardState::kStaged) {
        ++staged, staged_bytes += r.size();
      } else if (st.state == stager::ShardState::kFailed) {
        ++failed;
      } else {
        pending.push_back(r.name());
        copying += st.bytes;
        auto [it, fresh] = moved.try_emplace(r.name(), st.bytes, now);
        if (!fresh && it->second.first != st.bytes) it->second = {st.bytes, now};
        if (st.state == stager::ShardState::kStaging && now - it->second.second > still) {
          still = now - it->second.second;
          slowest = absl::StrCat(r.name(), " (", FormatBytes(st.bytes), " of ",
                                 FormatBytes(r.size()), ")");
        }
      }
    }
    const bool done = pending.empty();
    if (!quiet && (done || (periodic && now >= next_line))) {
      next_line = now + every;
      const double secs = std::max(1e-6, SecondsSince(t0));
      const uint64_t copied = staged_bytes + copying;
      const double rate = (copied - std::min(copied, bytes_before)) / secs;
      const double eta = rate > 0 ? (total - std::min(total, copied)) / rate : 0;
      std::string line =
          absl::StrFormat("[%u/%zu shards] %s of %s  %s/s  ETA %.0f s", staged, refs.size(),
                          FormatBytes(copied).c_str(), FormatBytes(total).c_str(),
                          FormatBytes(static_cast<uint64_t>(rate)).c_str(), eta);
      if (failed) absl::StrAppend(&line, "  ", failed, " failed");
      if (!done && still >= std::min(absl::Seconds(5), o.op_timeout / 4)) {
        absl::StrAppend(&line, "  waiting on ", slowest, ": no progress for ",
                        absl::FormatDuration(absl::Trunc(still, absl::Seconds(1))));
      }
      std::fprintf(stderr, "%s%s%s", tty ? "\r\033[K" : "", line.c_str(), tty && !done ? "" : "\n");
    }
    if (done) break;
    // Returns when these are all staged, one fails, or after a second.
    (void)engine.Wait(pending, absl::Now() + absl::Seconds(1));
  }
  std::vector<std::string> not_staged;
  for (const v1::ShardRef& r : refs) {
    const stager::ShardStatusInfo st = engine.Status(r.name());
    if (st.state == stager::ShardState::kFailed) {
      not_staged.push_back(r.name());
      // Staging's messages name the shard already; others get its name.
      const std::string why(st.error.message());
      std::fprintf(stderr, "tutti stage: %s%s\n",
                   absl::StrContains(why, r.name()) ? "" : (r.name() + ": ").c_str(), why.c_str());
    }
  }
  engine.Stop();
  std::printf("staged %u of %zu shards into %s (%u were cached already), %s in %.1f s%s\n", staged,
              refs.size(), cache_dir.c_str(), cached_before, FormatBytes(staged_bytes).c_str(),
              SecondsSince(t0),
              failed ? absl::StrCat("; ", failed, " failed (named above): ",
                                    absl::StrJoin(not_staged, ", "), " not staged")
                           .c_str()
                     : "");
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace tutti::tools

TUTTI_COMMAND("stage", "warm a node's cache: copy the index's shards into it before a job",
              tutti::tools::RunStage);
