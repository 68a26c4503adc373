// The data path in the time model: every image of a step is read (from NFS,
// or from the node's NVMe cache once staged) and decoded on its node's
// decode threads; a step starts when every node has its batches. With a
// prefetch window of k steps a node prepares step s as soon as step s - k
// has started (the window has room) and it finished step s - 1's; without
// one (k = 0, a loader in the training loop) it starts when step s - 1
// ends. So data stalls appear in step time exactly when preparation cannot
// hide behind compute: slow reads, a read that stalls, too few decode
// threads for the images, or no window.
//
// Reads: NVMe at a fixed latency and bandwidth; NFS with a log-normal
// latency (its tail), a per-stream bandwidth, and now and then a read that
// stalls (nfs_stall_probability, nfs_stall_seconds). A deadline (the
// stager's sample_deadline_ms) caps an item's read and decode: past it the
// sample is substituted and the batch ships.
#ifndef TUTTI_TOOLS_SIM_DATA_PATH_H_
#define TUTTI_TOOLS_SIM_DATA_PATH_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/status/status.h"

namespace tutti::sim {

struct DataPathOptions {
  bool staged = true;            // read from the node's NVMe cache (else from NFS)
  uint32_t prefetch_window = 4;  // steps prepared ahead (tutti-stagerd --window)
  uint32_t decode_threads = 64;  // per node
  double deadline_seconds = 2;   // per item; 0: none (a stalled read stalls the step)
  // Decode, resize and patchify CPU time: tutti bench decode's 16 MP cases
  // per source megapixel (JPEG 8.6 ms, PNG 16 ms, WebP 30 ms at a
  // jpg:7,png:2,webp:1 mix), plus a fixed cost per image.
  double decode_seconds_per_megapixel = 0.012;
  double decode_seconds_per_image = 0.001;
  double nvme_latency_seconds = 100e-6;
  double nvme_bandwidth = 2e9;  // bytes/s per read
  double nfs_median_latency_seconds = 4e-3;
  double nfs_latency_sigma = 1.0;  // log-space: p99 about 10x the median
  double nfs_bandwidth = 300e6;    // bytes/s per read
  double nfs_stall_probability = 2e-5;
  double nfs_stall_seconds = 30;
};

// INVALID_ARGUMENT naming a field that is negative, not finite, or zero
// where a rate or a thread count is needed.
absl::Status ValidateDataPath(const DataPathOptions& options);

// An image a node reads and decodes for a step.
struct DataItem {
  uint64_t bytes = 0;     // its member's size
  double megapixels = 0;  // its source size (the decode reads all of it)
  uint64_t key = 0;       // identifies it for the read's random draws
};

class DataPipeline {
 public:
  DataPipeline(DataPathOptions options, uint32_t nodes, uint64_t seed);

  // One step: its images by node, and its compute time once started.
  // Returns the step's data stall (how long it waited for its batches
  // after the previous step ended).
  double Step(uint64_t step, const std::vector<std::vector<DataItem>>& by_node,
              double compute_seconds);

  // Seconds one item takes to read and decode (deadline applied).
  double ItemSeconds(uint64_t step, const DataItem& item) const;

 private:
  // Seconds the node's decode threads take for the items (longest first
  // onto the least loaded thread).
  double Makespan(uint64_t step, const std::vector<DataItem>& items) const;

  DataPathOptions o_;
  uint32_t nodes_;
  uint64_t seed_;
  double last_end_ = 0;            // when the previous step ended
  std::vector<double> node_done_;  // when each node finished its previous step's batches
  std::deque<double> starts_;      // start times of the last prefetch_window steps
};

}  // namespace tutti::sim

#endif  // TUTTI_TOOLS_SIM_DATA_PATH_H_
