// Metrics every tutti process exports besides its own: the standard process_*
// family (read from /proc/self at each scrape) and tutti_build_info.
#ifndef TUTTI_COMMON_PROCESS_METRICS_H_
#define TUTTI_COMMON_PROCESS_METRICS_H_

#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

namespace tutti {

// The version and the source commit this binary was built from ("unknown"
// when built outside a git checkout).
const std::string& BuildVersion();
const std::string& BuildCommit();

// process_cpu_seconds_total, process_resident_memory_bytes,
// process_virtual_memory_bytes, process_open_fds, process_max_fds,
// process_start_time_seconds, tutti_build_info{version,commit} = 1, and the
// allocator's tutti_process_heap_in_use_bytes and tutti_process_heap_free_bytes.
class ProcessMetrics final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace tutti

#endif  // TUTTI_COMMON_PROCESS_METRICS_H_
