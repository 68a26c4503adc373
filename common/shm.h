// POSIX shared-memory segments: the stager writes batches into them and
// clients map them read-only without copying.
#ifndef TUTTI_COMMON_SHM_H_
#define TUTTI_COMMON_SHM_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tutti {

// Who may map a new segment besides its creator.
struct ShmAccess {
  unsigned mode = 0640;  // owner writes, the group reads
  int gid = -1;          // the segment's group; -1 = the creator's own
};

class ShmSegment {
 public:
  // Creates a new segment of `size` bytes, mapped read-write, with `access`
  // (whatever the umask). A name that exists already is never replaced:
  // ALREADY_EXISTS (pick another name).
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& name, size_t size,
                                                            const ShmAccess& access = {});
  // Maps an existing segment; size is taken from the segment.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Open(const std::string& name, bool writable);
  // Maps an existing segment copy-on-write from a read-only descriptor:
  // reads see the segment, writes go to pages private to this process (the
  // segment and other processes never see them).
  static absl::StatusOr<std::unique_ptr<ShmSegment>> OpenCopyOnWrite(const std::string& name);
  // Removes the name (mappings stay valid until unmapped).
  static void Unlink(const std::string& name);
  // Removes every segment whose name starts with `prefix` ("/name-start");
  // returns how many. Only for prefixes this process owns.
  static absl::StatusOr<int> UnlinkWithPrefix(const std::string& prefix);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  char* data() const { return static_cast<char*>(addr_); }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  static absl::StatusOr<std::unique_ptr<ShmSegment>> MapExisting(const std::string& name,
                                                                 bool writable, bool private_copy);
  ShmSegment(std::string name, void* addr, size_t size) : name_(std::move(name)), addr_(addr), size_(size) {}
  std::string name_;
  void* addr_;
  size_t size_;
};

}  // namespace tutti

#endif  // TUTTI_COMMON_SHM_H_
