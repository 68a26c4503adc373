#include "common/process_metrics.h"

#include <dirent.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/build_info.h"

namespace tutti {
namespace {

prometheus::MetricFamily Family(std::string name, std::string help, prometheus::MetricType type,
                                double value) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
  return f;
}

// Fields of /proc/self/stat after the command name (field 3 onwards), or empty.
std::vector<std::string> StatFields() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  std::getline(in, line);
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos) return {};
  return absl::StrSplit(line.substr(paren + 2), ' ', absl::SkipEmpty());
}

double BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  std::string key;
  double value = 0;
  while (in >> key) {
    if (key == "btime") {
      in >> value;
      return value;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

int OpenFds() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  int n = 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n - 1;  // the directory's own fd
}

}  // namespace

const std::string& BuildVersion() {
  static const std::string v = kTuttiVersion;
  return v;
}

const std::string& BuildCommit() {
  static const std::string c = kTuttiCommit;
  return c;
}

std::vector<prometheus::MetricFamily> ProcessMetrics::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  prometheus::MetricFamily info;
  info.name = "tutti_build_info";
  info.help = "The tutti version and source commit of this binary (always 1)";
  info.type = MetricType::Gauge;
  prometheus::ClientMetric m;
  m.label = {{"commit", BuildCommit()}, {"version", BuildVersion()}};
  m.gauge.value = 1;
  info.metric.push_back(std::move(m));
  out.push_back(std::move(info));

  const std::vector<std::string> f = StatFields();
  // Counting from field 3 (state): utime 14, stime 15, starttime 22, vsize 23, rss 24.
  auto field = [&](size_t n) {
    double v = 0;
    if (n - 3 < f.size()) (void)absl::SimpleAtod(f[n - 3], &v);
    return v;
  };
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  if (!f.empty() && ticks > 0) {
    out.push_back(Family("process_cpu_seconds_total", "User and system CPU time spent, in seconds",
                         MetricType::Counter, (field(14) + field(15)) / ticks));
    out.push_back(Family("process_start_time_seconds",
                         "Start time of the process since the Unix epoch, in seconds",
                         MetricType::Gauge, BootTimeSeconds() + field(22) / ticks));
    out.push_back(Family("process_virtual_memory_bytes", "Virtual memory size, in bytes",
                         MetricType::Gauge, field(23)));
    out.push_back(Family("process_resident_memory_bytes", "Resident memory size, in bytes",
                         MetricType::Gauge, field(24) * page));
  }
  // What the allocator has handed out and not had back, beside what it
  // holds free: with the resident size they tell memory the process keeps
  // from pages of memory it already had becoming resident.
  if (kHeapMetricsExported) {
    const struct mallinfo2 heap = ::mallinfo2();
    out.push_back(Family("tutti_process_heap_in_use_bytes",
                         "Bytes allocated with malloc and not yet freed, in the arenas and mapped "
                         "on their own (glibc mallinfo2 uordblks + hblkhd)",
                         MetricType::Gauge, static_cast<double>(heap.uordblks + heap.hblkhd)));
    out.push_back(Family("tutti_process_heap_free_bytes",
                         "Bytes the allocator's arenas hold free for later allocations, resident "
                         "or not (glibc mallinfo2 fordblks)",
                         MetricType::Gauge, static_cast<double>(heap.fordblks)));
  }
  out.push_back(Family("process_open_fds", "Number of open file descriptors", MetricType::Gauge,
                       OpenFds()));
  struct rlimit lim;
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    out.push_back(Family("process_max_fds", "Maximum number of open file descriptors",
                         MetricType::Gauge,
                         lim.rlim_cur == RLIM_INFINITY ? -1 : static_cast<double>(lim.rlim_cur)));
  }
  return out;
}

}  // namespace tutti
