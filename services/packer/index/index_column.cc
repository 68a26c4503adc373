#include "services/packer/index/index_column.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status.h"

namespace tutti::packer {
namespace {

absl::Status WriteAll(int fd, const char* p, size_t n, uint64_t offset, const char* what) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return ErrnoStatus(w < 0 ? errno : EIO, what);
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, char* p, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return ErrnoStatus(r < 0 ? errno : EIO, "read an index column's temporary file");
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

}  // namespace

IndexColumn::~IndexColumn() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status IndexColumn::SpillTo(const std::string& dir) {
  if (fd_ >= 0) return absl::OkStatus();
  int fd = ::open(dir.c_str(), O_RDWR | O_TMPFILE | O_CLOEXEC, 0600);
  if (fd < 0) {
    // File systems without O_TMPFILE: a named file, unlinked at once.
    std::string tmpl = absl::StrCat(dir, "/.tutti-index-column-XXXXXX");
    fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd < 0) {
      return ErrnoStatus(
          errno, absl::StrCat("create a temporary file in ", dir, " for the index being written"));
    }
    ::unlink(tmpl.c_str());
  }
  fd_ = fd;
  return absl::OkStatus();
}

void IndexColumn::Append(const void* data, size_t n) {
  if (n == 0) return;
  crc_ = Crc32cExtend(crc_, data, n);
  size_ += n;
  buf_.append(static_cast<const char*>(data), n);
  if (fd_ >= 0 && buf_.size() >= kSpillBytes) Flush();
}

void IndexColumn::Flush() {
  if (!status_.ok() || buf_.empty()) return;
  status_ = WriteAll(fd_, buf_.data(), buf_.size(), spilled_, "write an index column");
  spilled_ += buf_.size();
  buf_.clear();
}

absl::Status IndexColumn::AppendTo(std::string* out) const {
  RETURN_IF_ERROR(status_);
  const size_t at = out->size();
  out->resize(at + spilled_);
  if (spilled_ > 0) RETURN_IF_ERROR(ReadAll(fd_, out->data() + at, spilled_, 0));
  out->append(buf_);
  return absl::OkStatus();
}

absl::Status IndexColumn::WriteTo(int fd, uint64_t offset) const {
  RETURN_IF_ERROR(status_);
  loff_t in = 0;
  loff_t out = static_cast<loff_t>(offset);
  bool copy_range = true;
  std::string block;
  while (static_cast<uint64_t>(in) < spilled_) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(spilled_ - in, 64 << 20));
    if (copy_range) {
      const ssize_t c = ::copy_file_range(fd_, &in, fd, &out, n, 0);
      if (c > 0) continue;
      if (c < 0 && errno == EINTR) continue;
      if (c < 0 && errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
        return ErrnoStatus(errno, "copy an index column into place");
      }
      copy_range = false;  // not across these file systems: read and write
    }
    block.resize(std::min<size_t>(n, 4 << 20));
    RETURN_IF_ERROR(ReadAll(fd_, block.data(), block.size(), static_cast<uint64_t>(in)));
    RETURN_IF_ERROR(
        WriteAll(fd, block.data(), block.size(), static_cast<uint64_t>(out), "write the index"));
    in += static_cast<loff_t>(block.size());
    out += static_cast<loff_t>(block.size());
  }
  return WriteAll(fd, buf_.data(), buf_.size(), static_cast<uint64_t>(out), "write the index");
}

}  // namespace tutti::packer
