#include "common/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tutti {

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name, size_t size) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("shm_open ", name));
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
  int fd = ::shm_open(name.c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("shm_open ", name));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("stat shared memory ", name));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* addr = ::mmap(nullptr, size == 0 ? 1 : size, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                      MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (addr == MAP_FAILED) return ErrnoStatus(err, absl::StrCat("map shared memory ", name));
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, addr, size));
}

void ShmSegment::Unlink(const std::string& name) { ::shm_unlink(name.c_str()); }

ShmSegment::~ShmSegment() {
  if (addr_ != nullptr) ::munmap(addr_, size_ == 0 ? 1 : size_);
}

}  // namespace tutti
