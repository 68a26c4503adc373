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

// Whether this build allocates with glibc's malloc, whose figures the heap
// metrics report: false in AddressSanitizer, ThreadSanitizer and
// MemorySanitizer builds, whose own allocator replaces it (glibc's arenas
// then hold next to nothing, so the metrics are not exported there).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kHeapMetricsExported = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
inline constexpr bool kHeapMetricsExported = false;
#else
inline constexpr bool kHeapMetricsExported = true;
#endif
#else
inline constexpr bool kHeapMetricsExported = true;
#endif

// process_cpu_seconds_total, process_resident_memory_bytes,
// process_virtual_memory_bytes, process_open_fds, process_max_fds,
// process_start_time_seconds, tutti_build_info{version,commit} = 1, and
// (kHeapMetricsExported) the allocator's tutti_process_heap_in_use_bytes and
// tutti_process_heap_free_bytes.
class ProcessMetrics final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace tutti

#endif  // TUTTI_COMMON_PROCESS_METRICS_H_
