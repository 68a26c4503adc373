#include "common/root_dir.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <deque>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace tutti {
namespace {

// The kernel's own bound on symlinks followed in one lookup.
constexpr int kMaxLinks = 40;

long Openat2(int dirfd, const char* path, int flags, unsigned mode) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.mode = (flags & (O_CREAT | O_TMPFILE)) != 0 ? mode : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  long r;
  // EAGAIN: a rename or mount raced with the lookup; the kernel asks to retry.
  for (int i = 0; i < 16; ++i) {
    r = ::syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
    if (r >= 0 || (errno != EAGAIN && errno != EINTR)) break;
  }
  return r < 0 ? -errno : r;
}

// Components of a relative name, "" and "." left out.
void PushFront(std::deque<std::string>* parts, absl::string_view name) {
  std::vector<std::string> v;
  for (absl::string_view p : absl::StrSplit(name, '/')) {
    if (!p.empty() && p != ".") v.emplace_back(p);
  }
  parts->insert(parts->begin(), v.begin(), v.end());
}

// Closes the fds of a walk's directory stack.
struct DirStack {
  std::vector<int> fds;
  ~DirStack() { Clear(); }
  void Clear() {
    for (int fd : fds) ::close(fd);
    fds.clear();
  }
};

}  // namespace

absl::StatusOr<ResolveMode> ParseResolveMode(absl::string_view name) {
  if (name == "auto") return ResolveMode::kAuto;
  if (name == "openat2") return ResolveMode::kOpenat2;
  if (name == "walk") return ResolveMode::kWalk;
  return absl::InvalidArgumentError(
      absl::StrCat("--path_resolve '", name,
                   "' is unknown: use auto (openat2 RESOLVE_BENEATH where the "
                   "kernel has it, else a checked walk), openat2 or walk"));
}

const char* ResolveModeName(ResolveMode mode) {
  switch (mode) {
    case ResolveMode::kAuto:
      return "auto";
    case ResolveMode::kOpenat2:
      return "openat2";
    case ResolveMode::kWalk:
      return "walk";
  }
  return "?";
}

bool Openat2Supported() {
  static const bool supported = [] {
    const long fd = Openat2(AT_FDCWD, ".", O_PATH | O_DIRECTORY, 0);
    if (fd >= 0) ::close(static_cast<int>(fd));
    return fd >= 0;
  }();
  return supported;
}

absl::StatusOr<std::unique_ptr<RootDir>> RootDir::Open(std::string path, ResolveMode mode) {
  if (path.empty()) return absl::InvalidArgumentError("empty directory path");
  const bool openat2 = mode != ResolveMode::kWalk && Openat2Supported();
  if (mode == ResolveMode::kOpenat2 && !openat2) {
    return absl::FailedPreconditionError(
        "this kernel (or its seccomp profile) has no openat2(2); use the checked walk (auto or "
        "walk)");
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return absl::NotFoundError(
          absl::StrCat("directory '", path, "' does not exist or is not a directory"));
    }
    return ErrnoStatus(err, absl::StrCat("open directory ", path));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("stat ", path));
  }
  std::string real;
  if (char* r = ::realpath(path.c_str(), nullptr)) {
    real = r;
    std::free(r);
  }
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return std::unique_ptr<RootDir>(
      new RootDir(std::move(path), std::move(real), fd, openat2, st.st_dev, st.st_ino));
}

RootDir::RootDir(std::string path, std::string real_path, int fd, bool openat2, dev_t dev,
                 ino_t ino)
    : path_(std::move(path)),
      real_path_(std::move(real_path)),
      fd_(fd),
      openat2_(openat2),
      dev_(dev),
      ino_(ino) {}

RootDir::~RootDir() { ::close(fd_); }

int RootDir::Open(const char* relative, int flags, unsigned mode) const {
  if (relative == nullptr || relative[0] == '/') return -EXDEV;
  if (openat2_) {
    const long r = Openat2(fd_, relative, flags, mode);
    // -EXDEV: leaving the root, or an absolute symlink, which the walk
    // follows when it names a path under the root.
    if (r != -EXDEV && r != -ENOSYS) return static_cast<int>(r);
  }
  return WalkOpen(relative, flags, mode);
}

bool RootDir::StripRoot(const std::string& target, std::string* rest) const {
  for (const std::string* root : {&path_, &real_path_}) {
    if (root->empty()) continue;
    if (*root == "/") {
      *rest = target.substr(1);
      return true;
    }
    if (target == *root || absl::StartsWith(target, *root + "/")) {
      *rest = target.substr(root->size());
      return true;
    }
  }
  return false;
}

int RootDir::WalkOpen(const char* relative, int flags, unsigned mode) const {
  if (relative == nullptr || relative[0] == '/') return -EXDEV;
  const bool nofollow = (flags & O_NOFOLLOW) != 0;
  std::deque<std::string> parts;
  PushFront(&parts, relative);
  if (parts.empty()) {
    const int fd = ::openat(fd_, ".", flags | O_CLOEXEC, mode);
    return fd < 0 ? -errno : fd;
  }
  DirStack stack;  // directories walked into below the root (which is not owned)
  int links = 0;
  while (!parts.empty()) {
    const std::string part = std::move(parts.front());
    parts.pop_front();
    const int dir = stack.fds.empty() ? fd_ : stack.fds.back();
    if (part == "..") {
      if (stack.fds.empty()) return -EXDEV;
      ::close(stack.fds.back());
      stack.fds.pop_back();
      continue;
    }
    const bool last = parts.empty();
    if (last && (flags & O_PATH) == 0) {
      const int fd = ::openat(dir, part.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
      if (fd >= 0) return fd;
      // ELOOP under O_NOFOLLOW (ENOTDIR with O_DIRECTORY): perhaps a symlink.
      const int err = errno;
      struct stat st;
      if ((err != ELOOP && err != ENOTDIR) || nofollow ||
          ::fstatat(dir, part.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISLNK(st.st_mode)) {
        return -err;
      }
    } else {
      // O_PATH | O_NOFOLLOW opens a symlink itself, so fstat tells what it is.
      const int fd = ::openat(dir, part.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) return -errno;
      struct stat st;
      if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        return -err;
      }
      if (!S_ISLNK(st.st_mode)) {
        if (last && ((flags & O_DIRECTORY) == 0 || S_ISDIR(st.st_mode))) return fd;
        if (!S_ISDIR(st.st_mode)) {
          ::close(fd);
          return -ENOTDIR;
        }
        stack.fds.push_back(fd);
        continue;
      }
      ::close(fd);
      if (last && nofollow) return -ELOOP;
    }
    // A symlink: its target takes its place, resolved by the same rules.
    if (++links > kMaxLinks) return -ELOOP;
    char buf[PATH_MAX];
    const ssize_t n = ::readlinkat(dir, part.c_str(), buf, sizeof(buf));
    if (n < 0) return errno == EINVAL ? -EAGAIN : -errno;  // replaced meanwhile
    if (static_cast<size_t>(n) >= sizeof(buf)) return -ENAMETOOLONG;
    const std::string target(buf, static_cast<size_t>(n));
    if (!target.empty() && target[0] == '/') {
      std::string rest;
      if (!StripRoot(target, &rest)) return -EXDEV;
      stack.Clear();  // continues from the root handle, never from the path
      PushFront(&parts, rest);
    } else {
      PushFront(&parts, target);
    }
    if (parts.empty()) {  // the link names the root itself
      const int fd = ::openat(fd_, ".", flags | O_CLOEXEC, mode);
      return fd < 0 ? -errno : fd;
    }
  }
  // Only ".." components after the last directory: open where the walk ended.
  const int fd = ::openat(stack.fds.empty() ? fd_ : stack.fds.back(), ".", flags | O_CLOEXEC, mode);
  return fd < 0 ? -errno : fd;
}

int RootDir::OpenParent(const std::string& relative, std::string* base) const {
  const size_t slash = relative.find_last_of('/');
  *base = slash == std::string::npos ? relative : relative.substr(slash + 1);
  if (base->empty() || *base == "." || *base == "..") return -EINVAL;
  const std::string parent = slash == std::string::npos ? "." : relative.substr(0, slash);
  return Open(parent.empty() ? "." : parent.c_str(), O_PATH | O_DIRECTORY);
}

int RootDir::Stat(const std::string& relative, struct stat* st) const {
  std::string base;
  const int dir = OpenParent(relative, &base);
  if (dir < 0) return dir;
  const int r = ::fstatat(dir, base.c_str(), st, AT_SYMLINK_NOFOLLOW);
  const int err = errno;
  ::close(dir);
  return r < 0 ? -err : 0;
}

int RootDir::Unlink(const std::string& relative) const {
  std::string base;
  const int dir = OpenParent(relative, &base);
  if (dir < 0) return dir;
  const int r = ::unlinkat(dir, base.c_str(), 0);
  const int err = errno;
  ::close(dir);
  return r < 0 ? -err : 0;
}

int RootDir::Rename(const std::string& from, const std::string& to) const {
  std::string from_base, to_base;
  const int dir = OpenParent(from, &from_base);
  if (dir < 0) return dir;
  const size_t fs = from.find_last_of('/'), ts = to.find_last_of('/');
  const bool same_dir = (fs == std::string::npos && ts == std::string::npos) ||
                        (fs != std::string::npos && ts != std::string::npos &&
                         from.compare(0, fs, to, 0, ts) == 0 && fs == ts);
  if (!same_dir) {
    ::close(dir);
    return -EXDEV;
  }
  to_base = ts == std::string::npos ? to : to.substr(ts + 1);
  const int r = ::renameat(dir, from_base.c_str(), dir, to_base.c_str());
  const int err = errno;
  ::close(dir);
  return r < 0 ? -err : 0;
}

int RootDir::MakeDirs(const std::string& relative_dir, unsigned mode) const {
  if (!relative_dir.empty() && relative_dir[0] == '/') return -EXDEV;
  std::string done;
  for (absl::string_view part : absl::StrSplit(relative_dir, '/', absl::SkipEmpty())) {
    if (part == ".") continue;
    if (part == "..") return -EXDEV;
    const std::string next = done.empty() ? std::string(part) : absl::StrCat(done, "/", part);
    const int fd = Open(next.c_str(), O_PATH | O_DIRECTORY);
    if (fd >= 0) {
      ::close(fd);
    } else if (fd == -ENOENT) {
      const int parent = Open(done.empty() ? "." : done.c_str(), O_PATH | O_DIRECTORY);
      if (parent < 0) return parent;
      const std::string name(part);
      const int r = ::mkdirat(parent, name.c_str(), mode);
      const int err = errno;
      ::close(parent);
      if (r != 0 && err != EEXIST) return -err;
    } else {
      return fd;
    }
    done = next;
  }
  return 0;
}

absl::Status RootDir::OutsideError(absl::string_view what, absl::string_view relative) const {
  return absl::PermissionDeniedError(
      absl::StrCat(what, " '", relative, "' resolves outside ", path_,
                   " (a symlink or '..' leads out of it): refused, nothing outside is opened"));
}

}  // namespace tutti
