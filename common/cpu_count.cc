#include "common/cpu_count.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tutti {
namespace {

std::string ReadSmall(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(ss.str()));
}

// ceil(quota / period), 0 when unlimited or unreadable.
unsigned Cpus(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<unsigned>((quota + period - 1) / period);
}

// "max 100000" or "150000 100000" (cgroup v2 cpu.max).
unsigned V2Limit(const std::string& dir) {
  const std::string text = ReadSmall(dir + "/cpu.max");
  std::vector<std::string> parts = absl::StrSplit(text, ' ', absl::SkipEmpty());
  int64_t quota = 0, period = 0;
  if (parts.size() != 2 || parts[0] == "max" || !absl::SimpleAtoi(parts[0], &quota) ||
      !absl::SimpleAtoi(parts[1], &period)) {
    return 0;
  }
  return Cpus(quota, period);
}

unsigned V1Limit(const std::string& dir) {
  int64_t quota = 0, period = 0;
  if (!absl::SimpleAtoi(ReadSmall(dir + "/cpu.cfs_quota_us"), &quota) ||
      !absl::SimpleAtoi(ReadSmall(dir + "/cpu.cfs_period_us"), &period)) {
    return 0;
  }
  return Cpus(quota, period);
}

// The lowest limit of `base` + `path` and its ancestors up to `base`. A
// path that does not exist under `base` (a container that sees only its
// own cgroup at the root) is read at `base` alone.
unsigned LowestUpTheTree(const std::string& base, std::string path, unsigned (*limit)(const std::string&)) {
  unsigned lowest = 0;
  auto take = [&](unsigned l) {
    if (l > 0) lowest = lowest == 0 ? l : std::min(lowest, l);
  };
  while (!path.empty() && path != "/") {
    take(limit(base + path));
    path = path.substr(0, path.find_last_of('/'));
  }
  take(limit(base));
  return lowest;
}

}  // namespace

unsigned CgroupCpuLimit(const std::string& cgroup_root, const std::string& self_cgroup) {
  unsigned lowest = 0;
  auto take = [&](unsigned l) {
    if (l > 0) lowest = lowest == 0 ? l : std::min(lowest, l);
  };
  for (absl::string_view line : absl::StrSplit(self_cgroup, '\n', absl::SkipEmpty())) {
    // "hierarchy-id:controllers:path"
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    const std::string& path = f[2];
    if (f[0] == "0" && f[1].empty()) {  // cgroup v2 (unified)
      take(LowestUpTheTree(cgroup_root, path, &V2Limit));
      take(LowestUpTheTree(cgroup_root + "/unified", path, &V2Limit));  // hybrid layout
      continue;
    }
    for (absl::string_view c : absl::StrSplit(f[1], ',')) {
      if (c != "cpu") continue;
      for (const std::string& mount : {absl::StrCat(cgroup_root, "/", f[1]),
                                       absl::StrCat(cgroup_root, "/cpu")}) {
        take(LowestUpTheTree(mount, path, &V1Limit));
      }
    }
  }
  return lowest;
}

unsigned UsableCpus() {
  unsigned cpus = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) cpus = static_cast<unsigned>(CPU_COUNT(&set));
  if (cpus == 0) cpus = std::max(1u, std::thread::hardware_concurrency());
  const unsigned quota = CgroupCpuLimit("/sys/fs/cgroup", ReadSmall("/proc/self/cgroup"));
  if (quota > 0) cpus = std::min(cpus, quota);
  return std::max(1u, cpus);
}

}  // namespace tutti
