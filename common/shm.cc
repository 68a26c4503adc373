#include "common/shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tutti {

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name, size_t size,
                                                               const ShmAccess& access) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) {
    return absl::AlreadyExistsError(absl::StrCat("shared memory segment ", name,
                                                 " exists already (another process's); not replaced"));
  }
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("shm_open ", name));
  // Created private, then opened to the group: no moment with wider access.
  if ((access.gid >= 0 &&
       ::fchown(fd, static_cast<uid_t>(-1), static_cast<gid_t>(access.gid)) != 0) ||
      ::fchmod(fd, access.mode) != 0) {
    const int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    return ErrnoStatus(err, absl::StrCat("give shared memory ", name, " to group ", access.gid,
                                         " (the daemon must belong to the group given with "
                                         "--socket_group)"));
  }
  const size_t mapped = size == 0 ? 1 : size;
  if (::ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    return ErrnoStatus(err, absl::StrCat("size shared memory ", name, " to ", mapped, " bytes"));
  }
  void* addr = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (addr == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    return ErrnoStatus(err, absl::StrCat("map shared memory ", name));
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, addr, size));
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Open(const std::string& name, bool writable) {
  return MapExisting(name, writable, /*private_copy=*/false);
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::OpenCopyOnWrite(const std::string& name) {
  return MapExisting(name, /*writable=*/false, /*private_copy=*/true);
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::MapExisting(const std::string& name,
                                                                    bool writable,
                                                                    bool private_copy) {
  int fd = ::shm_open(name.c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("shm_open ", name));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("stat shared memory ", name));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const int prot = writable || private_copy ? PROT_READ | PROT_WRITE : PROT_READ;
  void* addr =
      ::mmap(nullptr, size == 0 ? 1 : size, prot, private_copy ? MAP_PRIVATE : MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (addr == MAP_FAILED) return ErrnoStatus(err, absl::StrCat("map shared memory ", name));
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, addr, size));
}

void ShmSegment::Unlink(const std::string& name) { ::shm_unlink(name.c_str()); }

absl::StatusOr<int> ShmSegment::UnlinkWithPrefix(const std::string& prefix) {
  if (prefix.size() < 2 || prefix[0] != '/' || prefix.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", prefix, "' is not a segment name prefix (/name)"));
  }
  // shm_open names live in /dev/shm on Linux.
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr) return ErrnoStatus(errno, "list /dev/shm");
  const std::string start = prefix.substr(1);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    if (std::string_view(e->d_name).substr(0, start.size()) == start) names.push_back(e->d_name);
  }
  ::closedir(d);
  int removed = 0;
  for (const auto& n : names) removed += ::shm_unlink(absl::StrCat("/", n).c_str()) == 0;
  return removed;
}

ShmSegment::~ShmSegment() {
  if (addr_ != nullptr) ::munmap(addr_, size_ == 0 ? 1 : size_);
}

}  // namespace tutti
