// Whether a path is a mount point right now, read from /proc/mounts: the
// FUSE tests wait for tutti-slowfs to mount and to unmount with it.
#ifndef TUTTI_TESTS_MOUNTS_H_
#define TUTTI_TESTS_MOUNTS_H_

#include <fstream>
#include <string>

namespace tutti::mounts {

inline bool Mounted(const std::string& mnt) {
  std::ifstream m("/proc/mounts");
  std::string line;
  while (std::getline(m, line)) {
    if (line.find(" " + mnt + " ") != std::string::npos) return true;
  }
  return false;
}

}  // namespace tutti::mounts

#endif  // TUTTI_TESTS_MOUNTS_H_
