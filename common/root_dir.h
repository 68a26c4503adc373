// Files opened beneath a directory without ever leaving it: a dataset's
// source directory or a node's cache, where a symlink (or a ".." in a name)
// must not lead a root daemon to a file outside.
//
// A RootDir holds the directory open and resolves every name relative to
// that handle. Where the kernel has openat2(2) (Linux 5.6) the kernel does it
// with RESOLVE_BENEATH; elsewhere (an older kernel, or a seccomp profile
// that refuses the call) a checked walk opens one component at a time with
// O_NOFOLLOW and follows each symlink itself. Both give the same answer:
// - a relative symlink is followed while it stays beneath the root;
// - an absolute symlink is followed when its target names a path under the
//   root's path (as given, or with its own symlinks resolved), from the root
//   handle; any other absolute target is refused;
// - ".." never goes above the root.
// A name that would leave the root fails with -EXDEV and nothing is opened.
//
// Thread-safe: every method may be called from any thread.
#ifndef TUTTI_COMMON_ROOT_DIR_H_
#define TUTTI_COMMON_ROOT_DIR_H_

#include <sys/stat.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tutti {

// How names are resolved beneath a root.
enum class ResolveMode {
  kAuto,     // openat2 RESOLVE_BENEATH where the kernel has it, else the checked walk
  kOpenat2,  // openat2 or FAILED_PRECONDITION when the kernel lacks it
  kWalk,     // the checked walk always (as on a kernel without openat2)
};
// "auto" | "openat2" | "walk"; INVALID_ARGUMENT naming the value otherwise.
absl::StatusOr<ResolveMode> ParseResolveMode(absl::string_view name);
const char* ResolveModeName(ResolveMode mode);

// Whether openat2(2) works here; probed once (ENOSYS, or a seccomp refusal,
// means no).
bool Openat2Supported();

class RootDir {
 public:
  // Opens directory `path`. kOpenat2 where the kernel lacks openat2:
  // FAILED_PRECONDITION. NOT_FOUND / FAILED_PRECONDITION name the path.
  static absl::StatusOr<std::unique_ptr<RootDir>> Open(std::string path,
                                                       ResolveMode mode = ResolveMode::kAuto);
  ~RootDir();
  RootDir(const RootDir&) = delete;
  RootDir& operator=(const RootDir&) = delete;

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  // True when names are resolved by openat2, false for the checked walk.
  bool uses_openat2() const { return openat2_; }
  // The root's device and inode (to notice the path now naming another directory).
  dev_t dev() const { return dev_; }
  ino_t ino() const { return ino_; }

  // Opens `relative` beneath the root with open(2) `flags` (O_CLOEXEC is
  // added) and `mode` (with O_CREAT): the fd, or -errno; -EXDEV when the
  // name resolves outside the root. An absolute `relative` is refused
  // (-EXDEV). With O_NOFOLLOW a final symlink is not followed (-ELOOP).
  int Open(const char* relative, int flags, unsigned mode = 0) const;
  // Open() by the checked walk only.
  int WalkOpen(const char* relative, int flags, unsigned mode = 0) const;

  // The same resolution for the other things done to files beneath the root
  // (0 or -errno). The last component itself is never followed.
  int Stat(const std::string& relative, struct stat* st) const;
  int Unlink(const std::string& relative) const;
  // Renames `from` to `to`; both in the same directory beneath the root.
  int Rename(const std::string& from, const std::string& to) const;
  // Creates `relative_dir` and its missing parents beneath the root.
  int MakeDirs(const std::string& relative_dir, unsigned mode = 0755) const;

  // What a refusal says: the name, the root and why (PERMISSION_DENIED).
  absl::Status OutsideError(absl::string_view what, absl::string_view relative) const;

 private:
  RootDir(std::string path, std::string real_path, int fd, bool openat2, dev_t dev, ino_t ino);
  // Opens the directory that holds the last component of `relative` (an
  // O_PATH fd) and sets *base to that component. -errno on failure.
  int OpenParent(const std::string& relative, std::string* base) const;
  // For an absolute symlink target under the root's path: the rest of it,
  // relative to the root. False when it names a path outside.
  bool StripRoot(const std::string& target, std::string* rest) const;

  const std::string path_, real_path_;
  const int fd_;
  const bool openat2_;
  const dev_t dev_;
  const ino_t ino_;
};

}  // namespace tutti

#endif  // TUTTI_COMMON_ROOT_DIR_H_
