#include "services/stager/staging/cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tutti::stager {

ShardCache::ShardCache(std::string dir, uint64_t capacity_bytes, ResolveMode resolve)
    : dir_(std::move(dir)), capacity_(capacity_bytes), resolve_(resolve) {}

ShardCache::~ShardCache() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string ShardCache::PathOf(const std::string& name) const { return absl::StrCat(dir_, "/", name); }
std::string ShardCache::PartialPathOf(const std::string& name) const {
  return absl::StrCat(dir_, "/", name, kPartialSuffix);
}

absl::Status ShardCache::Open() {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create cache directory ", dir_, ": ",
                                                    ec.message(), "; pick another with --cache"));
  }
  absl::StatusOr<std::unique_ptr<RootDir>> root = RootDir::Open(dir_, resolve_);
  if (!root.ok()) return Annotate(root.status(), absl::StrCat("cache directory ", dir_));
  root_ = std::move(*root);
  const std::string lock = absl::StrCat(dir_, "/.tutti-lock");
  lock_fd_ = root_->Open(".tutti-lock", O_RDWR | O_CREAT | O_NOFOLLOW, 0600);
  if (lock_fd_ < 0) {
    errno = -lock_fd_;
    lock_fd_ = -1;
  }
  if (lock_fd_ < 0) return ErrnoStatus(errno, absl::StrCat("open ", lock));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cache directory ", dir_, " is in use by another tutti-stagerd (", lock,
        " is locked); give each daemon its own --cache"));
  }
  absl::MutexLock l(&mu_);
  entries_.clear();
  used_ = 0;
  return Scan("");
}

absl::Status ShardCache::Scan(const std::string& sub) {
  const std::string path = sub.empty() ? dir_ : absl::StrCat(dir_, "/", sub);
  const int dfd = root_->Open(sub.empty() ? "." : sub.c_str(), O_RDONLY | O_DIRECTORY);
  DIR* d = dfd >= 0 ? ::fdopendir(dfd) : nullptr;
  if (d == nullptr) {
    const int err = dfd < 0 ? -dfd : errno;
    if (dfd >= 0) ::close(dfd);
    return ErrnoStatus(err, absl::StrCat("read cache directory ", path));
  }
  std::vector<std::string> dirs;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    // ".tutti-*" at the top: the daemon's own files (lock, segment record).
    if (n == "." || n == ".." || (sub.empty() && absl::StartsWith(n, ".tutti-"))) continue;
    const std::string rel = sub.empty() ? n : absl::StrCat(sub, "/", n);
    struct stat st;
    if (::fstatat(dfd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      dirs.push_back(rel);
    } else if (S_ISREG(st.st_mode)) {
      if (absl::EndsWith(n, kPartialSuffix)) {
        root_->Unlink(rel);  // left by a crash: redo it
        continue;
      }
      if ((st.st_mode & 0007) != 0) {  // others may read it: the job's group at most
        const int fd = root_->Open(rel.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
        if (fd >= 0) {
          ::fchmod(fd, st.st_mode & 0750);
          ::close(fd);
        }
      }
      Entry& en = entries_[rel];
      en.bytes = static_cast<uint64_t>(st.st_size);
      en.last_use = static_cast<uint64_t>(st.st_mtime);  // older files first
      used_ += en.bytes;
    }
  }
  ::closedir(d);
  for (const auto& s : dirs) RETURN_IF_ERROR(Scan(s));
  // Logical clock continues after the newest file.
  for (const auto& [n, e] : entries_) clock_ = std::max(clock_, e.last_use);
  return absl::OkStatus();
}

void ShardCache::Remove(const std::string& name) const {
  if (root_) root_->Unlink(name);
}

bool ShardCache::Has(const std::string& name, uint64_t expected_size) {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(name);
  if (it == entries_.end() || it->second.reserved) return false;
  if (expected_size != 0 && it->second.bytes != expected_size) {
    Remove(name);  // stale copy of an older version
    used_ -= it->second.bytes;
    entries_.erase(it);
    return false;
  }
  it->second.last_use = ++clock_;
  return true;
}

absl::Status ShardCache::Reserve(const std::string& name, uint64_t bytes,
                                 std::vector<std::string>* evicted_names) {
  std::vector<std::pair<std::string, uint64_t>> evicted;
  absl::Status status;
  {
    absl::MutexLock l(&mu_);
    if (auto it = entries_.find(name); it != entries_.end()) {
      used_ -= it->second.bytes;  // replacing a stale or partial copy
      entries_.erase(it);
    }
    while (capacity_ != 0 && used_ + bytes > capacity_) {
      auto victim = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        const Entry& e = it->second;
        if (e.reserved || e.holds > 0 || pinned_.count(it->first)) continue;
        if (victim == entries_.end() || e.last_use < victim->second.last_use) victim = it;
      }
      if (victim == entries_.end()) break;
      Remove(victim->first);
      used_ -= victim->second.bytes;
      evicted.emplace_back(victim->first, victim->second.bytes);
      ++evictions_;
      entries_.erase(victim);
    }
    if (capacity_ != 0 && used_ + bytes > capacity_) {
      status = absl::ResourceExhaustedError(absl::StrCat(
          "cache ", dir_, " is full: shard ", name, " needs ", bytes, " bytes, ", used_, " of ",
          capacity_, " bytes are used by shards the window still needs (or being staged); raise "
          "--cache_capacity or lower --window / --stage_ahead"));
    } else {
      Entry& e = entries_[name];
      e.bytes = bytes;
      e.reserved = true;
      e.last_use = ++clock_;
      used_ += bytes;
    }
  }
  for (const auto& [n, b] : evicted) {
    if (evicted_names != nullptr) evicted_names->push_back(n);
    if (on_evict_) on_evict_(n, b);
  }
  return status;
}

void ShardCache::Commit(const std::string& name, uint64_t bytes) {
  absl::MutexLock l(&mu_);
  Entry& e = entries_[name];
  used_ = used_ - e.bytes + bytes;
  e.bytes = bytes;
  e.reserved = false;
  e.last_use = ++clock_;
}

void ShardCache::Abort(const std::string& name) {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(name);
  if (it == entries_.end() || !it->second.reserved) return;
  used_ -= it->second.bytes;
  entries_.erase(it);
}

void ShardCache::SetPinned(std::set<std::string> names) {
  absl::MutexLock l(&mu_);
  pinned_ = std::move(names);
}

void ShardCache::Hold(const std::string& name) {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(name);
  if (it != entries_.end()) ++it->second.holds;
}

void ShardCache::Unhold(const std::string& name) {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(name);
  if (it != entries_.end() && it->second.holds > 0) --it->second.holds;
}

uint64_t ShardCache::used_bytes() const {
  absl::MutexLock l(&mu_);
  return used_;
}

uint64_t ShardCache::cached_bytes() const {
  absl::MutexLock l(&mu_);
  uint64_t n = 0;
  for (const auto& [name, e] : entries_) {
    if (!e.reserved) n += e.bytes;
  }
  return n;
}

size_t ShardCache::cached_files() const {
  absl::MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& [name, e] : entries_) n += e.reserved ? 0 : 1;
  return n;
}

uint64_t ShardCache::evictions() const {
  absl::MutexLock l(&mu_);
  return evictions_;
}

void ShardCache::SetEvictionListener(std::function<void(const std::string&, uint64_t)> fn) {
  on_evict_ = std::move(fn);
}

}  // namespace tutti::stager
