#include "services/packer/index/index_builder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/cpu_count.h"
#include "common/readahead_file.h"
#include "common/root_dir.h"
#include "common/status.h"
#include "common/tar.h"
#include "services/packer/index/shard_scan.h"

namespace tutti::packer {
namespace {

namespace fs = std::filesystem;

}  // namespace

absl::StatusOr<std::vector<ListedShard>> ListShards(const std::string& dir,
                                                    std::vector<std::string>* refused) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec || !fs::exists(st)) {
    return absl::NotFoundError(
        absl::StrCat("source directory ", dir,
                     " does not exist; pass the directory holding the .tar shards "
                     "with --source"));
  }
  if (!fs::is_directory(st)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, " is not a directory; --source takes the directory holding the shards"));
  }
  // Each shard is checked as the stager opens it: beneath the directory,
  // never through a symlink out of it, and a regular file.
  ASSIGN_OR_RETURN(std::unique_ptr<RootDir> root, RootDir::Open(dir));
  std::vector<ListedShard> out;
  std::vector<std::string> left_out;
  fs::path base = fs::path(dir).lexically_normal();
  if (base.filename().empty()) base = base.parent_path();  // "data/" -> "data"
  fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec)
      return absl::PermissionDeniedError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
    const fs::path& p = it->path();
    // The name as found under `dir`, symbolic links not resolved: the
    // stager opens the same path under its --source.
    const std::string rel = p.lexically_normal().lexically_relative(base).generic_string();
    if (it->is_symlink(ec) && it->is_directory(ec)) {
      const int fd = root->Open(rel.c_str(), O_RDONLY | O_DIRECTORY);
      if (fd >= 0) {
        ::close(fd);
      } else {
        // Not walked: the stager would refuse every shard under it.
        it.disable_recursion_pending();
        if (fd == -EXDEV || fd == -ELOOP) {
          left_out.push_back(absl::StrCat(absl::CHexEscape(rel), ": ",
                                          root->OutsideError("directory", rel).message(),
                                          "; its shards are not indexed"));
        }
      }
      continue;
    }
    if (p.extension() != ".tar" || it->is_directory(ec)) continue;
    const int fd = root->Open(rel.c_str(), O_RDONLY | O_NONBLOCK);
    struct stat fst;
    if (fd == -EXDEV || fd == -ELOOP) {
      left_out.push_back(
          absl::StrCat(absl::CHexEscape(rel), ": ", root->OutsideError("shard", rel).message()));
    } else if (fd >= 0 && (::fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode))) {
      left_out.push_back(absl::StrCat(
          absl::CHexEscape(rel),
          ": not a regular file (a FIFO, socket or device); the stager refuses it too"));
    } else if (fd >= 0) {
      out.push_back(ListedShard{rel, static_cast<uint64_t>(fst.st_size),
                                int64_t{fst.st_mtim.tv_sec} * 1000000000 + fst.st_mtim.tv_nsec});
    }
    if (fd >= 0) ::close(fd);
  }
  std::sort(out.begin(), out.end(),
            [](const ListedShard& a, const ListedShard& b) { return a.name < b.name; });
  std::sort(left_out.begin(), left_out.end());
  if (out.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no .tar shards under ", dir,
        left_out.empty() ? ""
                         : absl::StrCat(" that the stager would open (", left_out.size(),
                                        " left out, e.g. ", left_out.front(), ")"),
        "; point --source at a WebDataset directory (write one with `tutti gen-dataset`)"));
  }
  if (refused != nullptr) *refused = std::move(left_out);
  return out;
}

uint32_t DefaultIndexThreads() { return std::clamp(UsableCpus(), 2u, 8u); }

std::string IndexOptionsMeta(const IndexBuildOptions& o) {
  std::string meta = absl::StrFormat(
      "bytes_per_token=%.17g vocab_size=%u max_source_side=%u max_source_pixels=%u "
      "max_aspect_ratio=%.17g max_images_per_sample=%u max_shard_members=%u max_text_bytes=%u",
      o.bytes_per_token, o.vocab_size, o.max_source_side, o.max_source_pixels, o.max_aspect_ratio,
      o.max_images_per_sample, o.max_shard_members, o.max_text_bytes);
  // Only when set, so that an index built before they existed is reused.
  if (o.image_placeholder_id >= 0 || o.audio_placeholder_id >= 0) {
    // placeholder_positions: the index records where each run goes (MPOS);
    // an index of placeholders built before it did is not reused.
    absl::StrAppendFormat(&meta,
                          " image_placeholder_id=%d audio_placeholder_id=%d "
                          "placeholder_positions=1",
                          o.image_placeholder_id, o.audio_placeholder_id);
  }
  return meta;
}

namespace {

// A shard of the listing and where its part of the index comes from.
struct ShardTask {
  ListedShard listed;
  int64_t prev_shard = -1;  // unchanged: copied from the previous index
  int64_t prev_bad = -1;    // unchanged and left out last time: left out again
  bool read() const { return prev_shard < 0 && prev_bad < 0; }
};

// Why `prev` cannot stand in for reading shards of this build ("" when it can).
std::string Unusable(const Index& prev, const IndexBuildOptions& o, const std::string& source) {
  if (prev.source_dir() != source) {
    return absl::StrCat("it indexed ", prev.source_dir(), ", not ", source);
  }
  if (prev.meta("options") != IndexOptionsMeta(o)) {
    return absl::StrCat("it was built with other options (", prev.meta("options"), ")");
  }
  if (prev.num_samples() > 0 && !prev.has_member_crc32c()) {
    return "it records no member checksums";
  }
  return "";
}

// Which shards to read and which to take from `options.previous`.
absl::StatusOr<std::vector<ShardTask>> PlanShards(const IndexBuildOptions& o,
                                                  const std::string& source,
                                                  std::vector<ListedShard> listed,
                                                  IndexBuildReport* rep) {
  std::vector<ShardTask> tasks;
  for (ListedShard& l : listed) tasks.push_back(ShardTask{std::move(l)});
  const Index* prev = o.previous.get();
  if (prev != nullptr) rep->not_incremental = Unusable(*prev, o, source);
  if (prev == nullptr || !rep->not_incremental.empty()) {
    if (o.append) {
      return absl::FailedPreconditionError(
          absl::StrCat("--append adds shards to the index at --out, but ",
                       prev == nullptr ? "there is none" : rep->not_incremental,
                       "; run without --append to index every shard"));
    }
    return tasks;
  }
  struct Recorded {
    int64_t shard = -1, bad = -1;
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    bool listed = false;
  };
  std::map<std::string, Recorded> recorded;  // by name: shards, then those left out
  for (uint32_t i = 0; i < prev->num_shards(); ++i) {
    const IndexShard& s = prev->shard(i);
    recorded[s.name] = Recorded{i, -1, s.size, s.mtime_ns};
  }
  for (size_t i = 0; i < prev->bad_shards().size(); ++i) {
    const IndexBadShard& b = prev->bad_shards()[i];
    recorded.try_emplace(b.name, Recorded{-1, static_cast<int64_t>(i), b.size, b.mtime_ns});
  }
  for (ShardTask& t : tasks) {
    auto it = recorded.find(t.listed.name);
    if (it == recorded.end()) {
      if (o.append && !recorded.empty() && t.listed.name < recorded.rbegin()->first) {
        return absl::FailedPreconditionError(absl::StrCat(
            "--append: new shard ", absl::CHexEscape(t.listed.name), " sorts before ",
            absl::CHexEscape(recorded.rbegin()->first),
            ", already indexed, so the samples after it would be renumbered; name new shards to "
            "sort last, or run without --append to index it in place"));
      }
      continue;
    }
    Recorded& r = it->second;
    r.listed = true;
    const bool same =
        t.listed.mtime_ns != 0 && r.size == t.listed.size && r.mtime_ns == t.listed.mtime_ns;
    if (!same && o.append) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--append: shard ", absl::CHexEscape(t.listed.name),
          " changed since the index at --out was built (size or modification time); run "
          "without --append to read it again"));
    }
    if (same) (r.shard >= 0 ? t.prev_shard : t.prev_bad) = r.shard >= 0 ? r.shard : r.bad;
  }
  for (const auto& [name, r] : recorded) {
    if (r.listed || r.shard < 0) continue;
    if (o.append) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--append: shard ", absl::CHexEscape(name),
          " is in the index at --out but gone from the source; run without --append to drop it"));
    }
    ++rep->shards_removed;
  }
  return tasks;
}

// Reads one shard (opened through `io`), as `options.reader` says.
ShardResult ReadShard(const IndexBuildOptions& o, IoService* io,
                      const std::shared_ptr<ReadAheadBufferPool>& pool, const RootDir& root,
                      const std::string& rel) {
  const std::string path = (fs::path(o.source_dir) / rel).string();
  ShardResult bad;
  bad.status = CheckRelativeName(rel, "shard");
  if (!bad.status.ok()) return bad;
  absl::StatusOr<OpenedFile> f = OpenThroughIoService(io, root, rel, path, o.read_timeout);
  if (!f.ok()) {
    bad.status = f.status();
    return bad;
  }
  ShardScanner scanner(o, rel);
  ShardChecksums sums;
  ShardResult r;
  if (o.reader == ShardReader::kReadAhead) {
    ReadAheadOptions ra;
    ra.chunk_bytes = o.read_bytes;
    ra.depth = o.io_depth;
    ra.read_timeout = o.read_timeout;
    ra.pool = pool;
    ReadAheadFile file(io, f->fd, f->size, path, ra,
                       [&sums](uint64_t off, absl::string_view bytes) { sums.Feed(off, bytes); });
    r = scanner.Scan(file, &sums, [&file] { return file.Drain(); });
  } else {
    IoServiceFile file(io, f->fd, f->size, path, o.read_timeout);
    r = scanner.Scan(file, &sums, [&] { return ChecksumPass(file, &sums); });
  }
  r.size = f->size;
  r.mtime_ns = f->mtime_ns;
  return r;
}

absl::StatusOr<std::unique_ptr<IoService>> MakeIoService(const IndexBuildOptions& o) {
  const unsigned threads = std::max(1u, o.threads);
  const unsigned in_flight =
      threads * (o.reader == ShardReader::kReadAhead ? std::max(1u, o.io_depth) : 1u);
  ASSIGN_OR_RETURN(const bool uring, ResolveIoBackend(o.io_backend));
  std::unique_ptr<IoBackend> backend;
  if (uring) {
    // Reads on a network or FUSE file system block in the kernel's workers:
    // as many of them as reads in flight.
    ASSIGN_OR_RETURN(backend, MakeUringBackend(in_flight + threads + 4, in_flight + threads));
  } else {
    backend = MakePreadBackend(in_flight + threads);
  }
  return std::make_unique<IoService>(std::move(backend));
}

// One build: plans which shards to read, reads them on a pool of threads
// and commits every shard's part to the writer in listing order.
class Builder {
 public:
  Builder(const IndexBuildOptions& options, IndexBuildReport* report,
          const std::function<void(const IndexBuildProgress&)>& progress, IndexWriter* writer)
      : o_(options), rep_(*report), progress_(progress), writer_(writer) {}

  absl::Status Run();

 private:
  void Worker();
  // Commits shards in listing order: reused ones from the previous index,
  // read ones once their result is in.
  void Commit() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CommitReused(const ShardTask& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CommitRead(const ShardTask& t, ShardResult r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A shard left out: recorded, or the build fails (skip_bad_shards false).
  void LeftOut(const ShardTask& t, const absl::Status& why, uint64_t size, int64_t mtime_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CanStart() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !failure_.ok() || next_ >= to_read_.size() || to_read_[next_] < next_commit_ + ahead_;
  }

  const IndexBuildOptions& o_;
  const Index* prev_ = nullptr;
  std::vector<ShardTask> tasks_;
  std::vector<size_t> to_read_;  // into tasks_
  std::unique_ptr<RootDir> root_;
  std::unique_ptr<IoService> io_;
  std::shared_ptr<ReadAheadBufferPool> pool_;
  size_t ahead_ = 0;

  absl::Mutex mu_;
  IndexBuildReport& rep_ ABSL_GUARDED_BY(mu_);
  const std::function<void(const IndexBuildProgress&)>& progress_;
  IndexWriter* const writer_ ABSL_PT_GUARDED_BY(mu_);
  IndexBuildProgress prog_ ABSL_GUARDED_BY(mu_);
  std::map<size_t, ShardResult> done_ ABSL_GUARDED_BY(mu_);  // read, not yet committed
  size_t next_commit_ ABSL_GUARDED_BY(mu_) = 0;              // into tasks_
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;                     // into to_read_
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> skipped_ ABSL_GUARDED_BY(mu_);
};

absl::Status Builder::Run() {
  absl::MutexLock l(&mu_);
  std::vector<std::string> refused;
  ASSIGN_OR_RETURN(std::vector<ListedShard> listed, ListShards(o_.source_dir, &refused));
  rep_ = IndexBuildReport();
  rep_.shards_total = static_cast<uint32_t>(listed.size() + refused.size());
  if (!refused.empty() && !o_.skip_bad_shards) {
    return absl::PermissionDeniedError(
        absl::StrCat("shard ", refused.front(), " (", refused.size(),
                     " left out in all; pass --skip-bad-shards to index the other shards)"));
  }
  rep_.bad_shards = refused;
  // The source as recorded, and as a rerun must name it to reuse the index
  // ("data" and "data/" alike).
  fs::path source_path = fs::absolute(o_.source_dir).lexically_normal();
  if (source_path.filename().empty()) source_path = source_path.parent_path();
  const std::string source = source_path.string();
  ASSIGN_OR_RETURN(tasks_, PlanShards(o_, source, std::move(listed), &rep_));
  prev_ = o_.previous.get();
  prog_.shards_total = rep_.shards_total;
  prog_.shards_done = static_cast<uint32_t>(refused.size());
  for (size_t i = 0; i < tasks_.size(); ++i) {
    if (tasks_[i].read()) {
      to_read_.push_back(i);
      prog_.bytes_total += tasks_[i].listed.size;
    }
  }
  ASSIGN_OR_RETURN(root_, RootDir::Open(o_.source_dir));
  if (!to_read_.empty()) {
    ASSIGN_OR_RETURN(io_, MakeIoService(o_));
  }
  // Read buffers shared by the shards, so each shard does not fault in its own.
  const uint64_t chunk = std::max<uint64_t>(4096, o_.read_bytes / 4096 * 4096);
  pool_ = std::make_shared<ReadAheadBufferPool>(
      chunk, size_t{std::max(1u, o_.threads)} * (std::max(1u, o_.io_depth) + 2));
  writer_->SetSourceDir(source);
  writer_->AddMeta("builder", "tutti index");
  writer_->AddMeta("options", IndexOptionsMeta(o_));

  const uint32_t threads =
      std::max<uint32_t>(1, std::min<uint32_t>(o_.threads, static_cast<uint32_t>(to_read_.size())));
  // Results wait to be committed in order: a worker keeps at most this many
  // shards ahead of the first one not committed.
  ahead_ = size_t{4} * threads;
  Commit();  // the reused shards before the first to read
  if (progress_ && !to_read_.empty()) progress_(prog_);
  std::vector<std::thread> pool;
  mu_.Unlock();
  for (uint32_t t = 0; t < threads && !to_read_.empty(); ++t) {
    pool.emplace_back([this] { Worker(); });
  }
  for (auto& t : pool) t.join();
  mu_.Lock();
  RETURN_IF_ERROR(failure_);
  if (next_commit_ != tasks_.size()) return absl::InternalError("index build left shards behind");
  rep_.skipped = skipped_;
  if (rep_.samples == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable sample in ", o_.source_dir, " (", rep_.bad_shards.size(), " bad shards, ",
        rep_.skipped.size(), " skip reasons); see the messages above"));
  }
  for (const auto& [k, v] : rep_.skipped) {
    writer_->AddMeta(absl::StrCat("skipped.", k), absl::StrCat(v));
  }
  writer_->AddMeta("bad_shards", absl::StrCat(rep_.bad_shards.size()));
  return writer_->status();
}

void Builder::Worker() {
  while (true) {
    size_t i;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &Builder::CanStart));
      if (!failure_.ok() || next_ >= to_read_.size()) return;
      i = to_read_[next_++];
    }
    ShardResult r = ReadShard(o_, io_.get(), pool_, *root_, tasks_[i].listed.name);
    absl::MutexLock l(&mu_);
    prog_.bytes_done += tasks_[i].listed.size;
    done_.emplace(i, std::move(r));
    Commit();
    if (progress_) progress_(prog_);
  }
}

void Builder::Commit() {
  while (failure_.ok() && next_commit_ < tasks_.size()) {
    const ShardTask& t = tasks_[next_commit_];
    if (t.prev_bad >= 0) {
      const IndexBadShard& b = prev_->bad_shards()[t.prev_bad];
      ++rep_.shards_reused;
      LeftOut(t, absl::DataLossError(b.why), b.size, b.mtime_ns);
    } else if (t.prev_shard >= 0) {
      CommitReused(t);
    } else {
      auto it = done_.find(next_commit_);
      if (it == done_.end()) return;
      ShardResult r = std::move(it->second);
      done_.erase(it);
      CommitRead(t, std::move(r));
    }
    ++next_commit_;
    ++prog_.shards_done;
    prog_.samples = rep_.samples;
  }
}

void Builder::CommitReused(const ShardTask& t) {
  const uint32_t shard = static_cast<uint32_t>(t.prev_shard);
  const IndexShard& sh = prev_->shard(shard);
  if (absl::Status s = writer_->CopyShard(*prev_, shard); !s.ok()) {
    failure_ = Annotate(s, absl::StrCat("shard ", t.listed.name));
    return;
  }
  for (uint32_t s = sh.first_sample; s < sh.first_sample + sh.num_samples; ++s) {
    ++(prev_->is_vl(s) ? rep_.vl_samples : rep_.text_samples);
    for (uint32_t j = prev_->media_begin(s); j < prev_->media_end(s); ++j) {
      ++(prev_->media_is_image(j) ? rep_.images : rep_.audio);
    }
  }
  for (const IndexSkip& k : prev_->skips()) {
    if (k.shard == shard) skipped_[k.reason] += k.count;
  }
  ++rep_.shards_indexed;
  ++rep_.shards_reused;
  rep_.samples += sh.num_samples;
  rep_.bytes += sh.size;
}

void Builder::CommitRead(const ShardTask& t, ShardResult r) {
  const std::string& rel = t.listed.name;
  ++rep_.shards_read;
  rep_.bytes_read += r.size;
  if (!r.status.ok()) return LeftOut(t, r.status, r.size, r.mtime_ns);
  absl::Status s = writer_->AddShard(rel, r.size, r.crc32c, r.mtime_ns);
  for (const SampleOut& o : r.samples) {
    if (!s.ok()) break;
    s = writer_->AddSample(o.key, o.text_tokens, o.has_text ? &o.text : nullptr, o.media);
    ++(o.media.empty() ? rep_.text_samples : rep_.vl_samples);
    for (const auto& m : o.media) ++(m.kind == MemberKind::kWav ? rep_.audio : rep_.images);
  }
  if (!s.ok()) {
    failure_ = Annotate(s, absl::StrCat("shard ", rel));
    return;
  }
  for (const auto& [k, v] : r.skipped) {
    writer_->AddSkipped(k, static_cast<uint32_t>(std::min<uint64_t>(v, UINT32_MAX)));
    skipped_[k] += v;
  }
  ++rep_.shards_indexed;
  rep_.samples += r.samples.size();
  rep_.bytes += r.size;
  rep_.ignored_members += r.ignored;
  for (const auto& [k, v] : r.skipped_members) rep_.skipped_members[k] += v;
  for (auto& e : r.examples) {
    if (rep_.skipped_examples.size() < 16) rep_.skipped_examples.push_back(std::move(e));
  }
  rep_.unknown_json_members += r.unknown_json_members;
  rep_.unknown_json_other += r.unknown_json_other;
  for (const auto& [field, n] : r.unknown_json_fields) {
    auto it = rep_.unknown_json_fields.find(field);
    if (it != rep_.unknown_json_fields.end()) {
      it->second += n;
    } else if (rep_.unknown_json_fields.size() < 32) {
      rep_.unknown_json_fields.emplace(field, n);
    } else {
      rep_.unknown_json_other += n;
    }
  }
}

void Builder::LeftOut(const ShardTask& t, const absl::Status& why, uint64_t size,
                      int64_t mtime_ns) {
  const std::string& rel = t.listed.name;
  // Recorded as read (UTF-8, as every string of the index).
  const std::string reason =
      IsValidUtf8(why.message()) ? std::string(why.message()) : absl::CHexEscape(why.message());
  if (!o_.skip_bad_shards) {
    failure_ = absl::Status(
        why.code(),
        absl::StrCat("shard ", absl::CHexEscape(rel), " is unusable: ", reason,
                     " (re-copy or rebuild it, or pass --skip-bad-shards to index the other "
                     "shards)"));
    return;
  }
  rep_.bad_shards.push_back(absl::StrCat(absl::CHexEscape(rel), ": ", reason));
  // A name the index cannot hold (not UTF-8) is refused again, unread, next time.
  if (!CheckRelativeName(rel, "shard").ok()) return;
  if (absl::Status s = writer_->AddBadShard(rel, size, mtime_ns, reason); !s.ok()) failure_ = s;
}

absl::Status Build(const IndexBuildOptions& options, IndexBuildReport* report,
                   const std::function<void(const IndexBuildProgress&)>& progress,
                   IndexWriter* writer) {
  IndexBuildReport local;
  Builder b(options, report ? report : &local, progress, writer);
  return b.Run();
}

}  // namespace

absl::StatusOr<std::string> BuildIndex(
    const IndexBuildOptions& options, IndexBuildReport* report,
    const std::function<void(const IndexBuildProgress&)>& progress) {
  IndexWriter writer;
  RETURN_IF_ERROR(Build(options, report, progress, &writer));
  return writer.Finish();
}

absl::Status BuildIndexFile(const IndexBuildOptions& options, const std::string& out,
                            IndexBuildReport* report,
                            const std::function<void(const IndexBuildProgress&)>& progress) {
  IndexWriter writer;
  fs::path dir = fs::path(out).parent_path();
  if (dir.empty()) dir = ".";
  RETURN_IF_ERROR(writer.SpillTo(dir.string()));
  RETURN_IF_ERROR(Build(options, report, progress, &writer));
  return writer.WriteFile(out);
}

}  // namespace tutti::packer
