#include "common/process_metrics.h"

#include <fcntl.h>
#include <unistd.h>

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

TEST(ProcessMetricsTest, OpenFdsFollowTheProcess) {
  const double before = Collected()["process_open_fds"].metric[0].gauge.value;
  const int a = ::open("/dev/null", O_RDONLY), b = ::open("/dev/null", O_RDONLY);
  EXPECT_EQ(Collected()["process_open_fds"].metric[0].gauge.value, before + 2);
  ::close(a);
  ::close(b);
}

}  // namespace
}  // namespace tutti
