#include "common/cpu_count.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "gtest/gtest.h"

namespace tutti {
namespace {

namespace fs = std::filesystem;

struct FakeCgroupFs {
  std::string root;
  FakeCgroupFs() {
    root = ::testing::TempDir() + "/cgroupfs_" + std::to_string(::getpid());
    fs::remove_all(root);
  }
  ~FakeCgroupFs() { fs::remove_all(root); }
  void Write(const std::string& rel, const std::string& text) {
    fs::create_directories(fs::path(root + "/" + rel).parent_path());
    std::ofstream(root + "/" + rel) << text;
  }
};

TEST(CpuCountTest, CgroupV2QuotaIsRoundedUpAndTheLowestAncestorWins) {
  FakeCgroupFs f;
  f.Write("kubepods/pod1/ctr/cpu.max", "150000 100000\n");  // 1.5 CPUs -> 2
  f.Write("kubepods/cpu.max", "max 100000\n");
  EXPECT_EQ(CgroupCpuLimit(f.root, "0::/kubepods/pod1/ctr\n"), 2u);
  f.Write("kubepods/pod1/cpu.max", "100000 100000\n");  // the pod's limit is lower
  EXPECT_EQ(CgroupCpuLimit(f.root, "0::/kubepods/pod1/ctr\n"), 1u);
  // Inside a cgroup namespace the process sees its own cgroup at the root.
  FakeCgroupFs ns;
  ns.Write("cpu.max", "400000 100000");
  EXPECT_EQ(CgroupCpuLimit(ns.root, "0::/\n"), 4u);
  FakeCgroupFs none;
  none.Write("cpu.max", "max 100000");
  EXPECT_EQ(CgroupCpuLimit(none.root, "0::/\n"), 0u);
}

TEST(CpuCountTest, CgroupV1QuotaIsRead) {
  FakeCgroupFs f;
  f.Write("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "250000");
  f.Write("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000");
  EXPECT_EQ(CgroupCpuLimit(f.root, "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n"), 3u);
  f.Write("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1");  // unlimited
  EXPECT_EQ(CgroupCpuLimit(f.root, "2:cpu,cpuacct:/docker/abc\n"), 0u);
}

TEST(CpuCountTest, ThisProcessMayUseAtLeastOneAndAtMostTheHostsCpus) {
  const unsigned n = UsableCpus();
  EXPECT_GE(n, 1u);
  EXPECT_LE(n, std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace
}  // namespace tutti
