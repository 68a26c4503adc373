// How many CPUs this process may use: not the host's core count but its
// affinity mask (taskset, cpusets), lowered by its cgroup's CPU quota (a
// container's CPU limit: cgroup v2 cpu.max, or v1 cpu.cfs_quota_us /
// cpu.cfs_period_us), rounded up.
#ifndef TUTTI_COMMON_CPU_COUNT_H_
#define TUTTI_COMMON_CPU_COUNT_H_

#include <string>

namespace tutti {

// At least 1.
unsigned UsableCpus();

// The CPU quota (rounded up to whole CPUs) of the cgroup a process is in,
// given the cgroup file system's mount point (normally "/sys/fs/cgroup") and
// the text of its /proc/self/cgroup; the lowest quota of that cgroup and its
// ancestors. 0 when there is no limit.
unsigned CgroupCpuLimit(const std::string& cgroup_root, const std::string& self_cgroup);

}  // namespace tutti

#endif  // TUTTI_COMMON_CPU_COUNT_H_
