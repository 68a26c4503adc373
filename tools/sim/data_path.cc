#include "tools/sim/data_path.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "services/packer/core/multiway_partition.h"

namespace tutti::sim {

absl::Status ValidateDataPath(const DataPathOptions& o) {
  const struct {
    const char* name;
    double value;
    bool positive;
  } fields[] = {{"decode_threads", static_cast<double>(o.decode_threads), true},
                {"deadline_seconds", o.deadline_seconds, false},
                {"decode_seconds_per_megapixel", o.decode_seconds_per_megapixel, false},
                {"decode_seconds_per_image", o.decode_seconds_per_image, false},
                {"nvme_latency_seconds", o.nvme_latency_seconds, false},
                {"nvme_bandwidth", o.nvme_bandwidth, true},
                {"nfs_median_latency_seconds", o.nfs_median_latency_seconds, false},
                {"nfs_latency_sigma", o.nfs_latency_sigma, false},
                {"nfs_bandwidth", o.nfs_bandwidth, true},
                {"nfs_stall_probability", o.nfs_stall_probability, false},
                {"nfs_stall_seconds", o.nfs_stall_seconds, false}};
  for (const auto& f : fields) {
    if (!std::isfinite(f.value) || f.value < 0 || (f.positive && f.value == 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("data path ", f.name, " is ", f.value, "; it must be ",
                       f.positive ? "a positive number" : "a number >= 0"));
    }
  }
  if (o.nfs_stall_probability > 1) {
    return absl::InvalidArgumentError(absl::StrCat("data path nfs_stall_probability is ",
                                                   o.nfs_stall_probability, "; it is at most 1"));
  }
  return absl::OkStatus();
}

DataPipeline::DataPipeline(DataPathOptions options, uint32_t nodes, uint64_t seed)
    : o_(options), nodes_(nodes), seed_(seed), node_done_(nodes, 0.0) {}

double DataPipeline::ItemSeconds(uint64_t step, const DataItem& item) const {
  double read;
  if (o_.staged) {
    read = o_.nvme_latency_seconds + item.bytes / o_.nvme_bandwidth;
  } else {
    Rng rng(MixSeed(MixSeed(seed_, step), item.key));
    read = rng.LogNormal(o_.nfs_median_latency_seconds, o_.nfs_latency_sigma) +
           item.bytes / o_.nfs_bandwidth;
    if (rng.Bernoulli(o_.nfs_stall_probability)) read += o_.nfs_stall_seconds;
  }
  const double decode =
      o_.decode_seconds_per_image + item.megapixels * o_.decode_seconds_per_megapixel;
  const double total = read + decode;
  return o_.deadline_seconds > 0 ? std::min(total, o_.deadline_seconds) : total;
}

double DataPipeline::Makespan(uint64_t step, const std::vector<DataItem>& items) const {
  if (items.empty()) return 0;
  std::vector<double> t(items.size());
  for (size_t i = 0; i < items.size(); ++i) t[i] = ItemSeconds(step, items[i]);
  std::sort(t.begin(), t.end(), std::greater<>());
  const uint32_t threads = std::max<uint32_t>(1, o_.decode_threads);
  if (t.size() <= threads) return t.front();
  // Longest processing time first; t is in LPT's order, so each thread's
  // load adds its items in the order they were placed.
  const std::vector<uint32_t> thread_of = packer::LptPartition(t, threads);
  std::vector<double> load(threads, 0.0);
  for (size_t i = 0; i < t.size(); ++i) load[thread_of[i]] += t[i];
  return *std::max_element(load.begin(), load.end());
}

double DataPipeline::Step(uint64_t step, const std::vector<std::vector<DataItem>>& by_node,
                          double compute_seconds) {
  double start = last_end_;
  const size_t k = o_.prefetch_window;
  // The step the window must have started for this one to be prepared.
  const double window_room = k == 0 ? last_end_ : (starts_.size() < k ? 0.0 : starts_.front());
  for (uint32_t n = 0; n < nodes_; ++n) {
    const double begin = std::max(node_done_[n], window_room);
    static const std::vector<DataItem> kNone;
    node_done_[n] = begin + Makespan(step, n < by_node.size() ? by_node[n] : kNone);
    start = std::max(start, node_done_[n]);
  }
  const double stall = start - last_end_;
  last_end_ = start + compute_seconds;
  if (k > 0) {
    starts_.push_back(start);
    while (starts_.size() > k) starts_.pop_front();
  }
  return stall;
}

}  // namespace tutti::sim
