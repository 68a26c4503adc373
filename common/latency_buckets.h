// Histogram buckets shared by every latency metric in tutti.
#ifndef TUTTI_COMMON_LATENCY_BUCKETS_H_
#define TUTTI_COMMON_LATENCY_BUCKETS_H_

#include <vector>

namespace tutti {

// Latencies from 100 us to 100 s.
inline const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                               0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                               1,      2.5,     5,      10,    25,     100};
  return kBuckets;
}

}  // namespace tutti

#endif  // TUTTI_COMMON_LATENCY_BUCKETS_H_
