#include "common/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace tutti {
namespace {

class LocalFile final : public RandomAccessFile {
 public:
  LocalFile(std::string path, int fd, uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
  ~LocalFile() override { ::close(fd_); }

  absl::Status ReadAt(uint64_t offset, size_t n, char* out, size_t* got) const override {
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, absl::StrCat("read ", path_, " at ", offset + done));
      }
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    *got = done;
    return absl::OkStatus();
  }
  uint64_t size() const override { return size_; }
  const std::string& name() const override { return path_; }

 private:
  std::string path_;
  int fd_;
  uint64_t size_;
};

class MemoryFile final : public RandomAccessFile {
 public:
  MemoryFile(std::string name, std::string data) : name_(std::move(name)), data_(std::move(data)) {}
  absl::Status ReadAt(uint64_t offset, size_t n, char* out, size_t* got) const override {
    if (offset >= data_.size()) {
      *got = 0;
      return absl::OkStatus();
    }
    *got = std::min<uint64_t>(n, data_.size() - offset);
    std::memcpy(out, data_.data() + offset, *got);
    return absl::OkStatus();
  }
  uint64_t size() const override { return data_.size(); }
  const std::string& name() const override { return name_; }

 private:
  std::string name_;
  std::string data_;
};

}  // namespace

absl::Status RandomAccessFile::ReadExactly(uint64_t offset, size_t n, char* out) const {
  size_t got = 0;
  RETURN_IF_ERROR(ReadAt(offset, n, out, &got));
  if (got != n) {
    return absl::DataLossError(absl::StrCat(name(), ": wanted ", n, " bytes at offset ", offset,
                                            " but the file ends at ", size(),
                                            " (truncated or changed while read)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RandomAccessFile::ReadString(uint64_t offset, size_t n) const {
  std::string s(n, '\0');
  RETURN_IF_ERROR(ReadExactly(offset, n, s.data()));
  return s;
}

absl::StatusOr<int> OpenRegularFile(const std::string& path, uint64_t* size) {
  // O_NONBLOCK: opening a FIFO without a writer (or a device) would block
  // here; it is refused below instead, before anything is read.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a regular file (",
                     S_ISFIFO(st.st_mode)   ? "a FIFO"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                     : S_ISDIR(st.st_mode)  ? "a directory"
                                            : "a device",
                     "): refused without reading it; give the path of a regular file"));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("fcntl ", path));
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenLocalFile(const std::string& path) {
  uint64_t size = 0;
  ASSIGN_OR_RETURN(int fd, OpenRegularFile(path, &size));
  return std::unique_ptr<RandomAccessFile>(new LocalFile(path, fd, size));
}

std::unique_ptr<RandomAccessFile> MakeMemoryFile(std::string name, std::string data) {
  return std::make_unique<MemoryFile>(std::move(name), std::move(data));
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  ASSIGN_OR_RETURN(auto file, OpenLocalFile(path));
  return file->ReadString(0, file->size());
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view data, unsigned mode) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create ", tmp));
  size_t done = 0;
  while (done < data.size()) {
    ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoStatus(err, absl::StrCat("write ", tmp));
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, absl::StrCat("fsync ", tmp));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, absl::StrCat("rename ", tmp, " to ", path));
  }
  std::string dir = path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/'));
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> JoinUnder(absl::string_view root, absl::string_view relative) {
  if (relative.empty()) return absl::InvalidArgumentError("empty path");
  if (relative.front() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("path '", relative, "' is absolute; only paths inside '", root, "' are allowed"));
  }
  for (absl::string_view part : absl::StrSplit(relative, '/')) {
    if (part == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          "path '", relative, "' has a '..' component that escapes '", root, "'"));
    }
  }
  if (relative.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError("path contains a NUL byte");
  }
  std::string out(root);
  if (!out.empty() && out.back() != '/') out.push_back('/');
  out.append(relative.data(), relative.size());
  return out;
}

}  // namespace tutti
