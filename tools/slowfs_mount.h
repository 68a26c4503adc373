// tutti-slowfs (tools/slowfs: a FUSE mount adding latency to every open and
// read) mounted for the lifetime of an object: the remote file system the
// benchmarks read from.
#ifndef TUTTI_TOOLS_SLOWFS_MOUNT_H_
#define TUTTI_TOOLS_SLOWFS_MOUNT_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace tutti::tools {

// The tutti-slowfs binary: `given` if set, else the one built next to this
// tool, else the PATH's.
std::string SlowfsBinary(const std::string& given);

class SlowfsMount {
 public:
  // Mounts `src` on `mnt` (created; a mount left there by an interrupted run
  // goes first) with `latency_ms` per open and read; `stalls` as
  // tutti-slowfs's --stall. ok() says whether it mounted (a line on stderr
  // when not: no FUSE?).
  SlowfsMount(const std::string& bin, const std::string& src, const std::string& mnt,
              double latency_ms, std::vector<std::string> stalls = {});
  ~SlowfsMount();
  SlowfsMount(const SlowfsMount&) = delete;
  SlowfsMount& operator=(const SlowfsMount&) = delete;
  bool ok() const { return mounted_; }

 private:
  std::string mnt_;
  pid_t pid_ = -1;
  bool mounted_ = false;
};

}  // namespace tutti::tools

#endif  // TUTTI_TOOLS_SLOWFS_MOUNT_H_
