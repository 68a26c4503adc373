#include "common/process_metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <map>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tutti {
namespace {

std::map<std::string, prometheus::MetricFamily> Collected() {
  std::map<std::string, prometheus::MetricFamily> out;
  for (auto& f : ProcessMetrics().Collect()) out[f.name] = f;
  return out;
}

TEST(ProcessMetricsTest, ReportsTheStandardProcessFamilyAndBuildInfo) {
  auto m = Collected();
  for (const char* name : {"process_cpu_seconds_total", "process_resident_memory_bytes",
                           "process_virtual_memory_bytes", "process_open_fds",
                           "process_max_fds", "process_start_time_seconds", "tutti_build_info"}) {
    ASSERT_TRUE(m.count(name)) << name;
    ASSERT_EQ(m[name].metric.size(), 1u) << name;
  }
  EXPECT_EQ(m["process_cpu_seconds_total"].type, prometheus::MetricType::Counter);
  EXPECT_GT(m["process_resident_memory_bytes"].metric[0].gauge.value, 1 << 20);
  EXPECT_GE(m["process_virtual_memory_bytes"].metric[0].gauge.value,
            m["process_resident_memory_bytes"].metric[0].gauge.value);
  const double start = m["process_start_time_seconds"].metric[0].gauge.value;
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  EXPECT_LE(start, now + 1);
  EXPECT_GT(start, now - 24 * 3600);  // this test process started recently
  const auto& info = m["tutti_build_info"].metric[0];
  EXPECT_EQ(info.gauge.value, 1);
  ASSERT_EQ(info.label.size(), 2u);
  EXPECT_EQ(info.label[0].name, "commit");
  EXPECT_FALSE(info.label[0].value.empty());
  EXPECT_EQ(info.label[1].name, "version");
  EXPECT_EQ(info.label[1].value, BuildVersion());
}

TEST(ProcessMetricsTest, HeapInUseFollowsWhatIsAllocated) {
  if (!kHeapMetricsExported) {
    // A sanitizer's allocator: glibc's figures would not be the process's.
    EXPECT_EQ(Collected().count("tutti_process_heap_in_use_bytes"), 0u);
    EXPECT_EQ(Collected().count("tutti_process_heap_free_bytes"), 0u);
    GTEST_SKIP() << "sanitizer build: its allocator replaces glibc's malloc";
  }
  auto heap = [] {
    return Collected()["tutti_process_heap_in_use_bytes"].metric.at(0).gauge.value;
  };
  ASSERT_GE(Collected()["tutti_process_heap_free_bytes"].metric.at(0).gauge.value, 0);
  const double before = heap();
  EXPECT_GT(before, 0);
  constexpr size_t kBytes = 48 << 20;
  // Allocated and never written: in use all the same, resident or not.
  static void* volatile big;  // seen outside, so the allocation is made
  big = std::malloc(kBytes);
  ASSERT_NE(big, nullptr);
  const double with = heap();
  std::free(big);
  const double after = heap();
  constexpr double kSlack = 1 << 20;  // what collecting itself allocates, give or take
  EXPECT_NEAR(with - before, static_cast<double>(kBytes), kSlack);
  EXPECT_NEAR(with - after, static_cast<double>(kBytes), kSlack);
}

TEST(ProcessMetricsTest, OpenFdsFollowTheProcess) {
  const double before = Collected()["process_open_fds"].metric[0].gauge.value;
  const int a = ::open("/dev/null", O_RDONLY), b = ::open("/dev/null", O_RDONLY);
  EXPECT_EQ(Collected()["process_open_fds"].metric[0].gauge.value, before + 2);
  ::close(a);
  ::close(b);
}

}  // namespace
}  // namespace tutti
