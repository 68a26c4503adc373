// A fixed pool of worker threads running tasks in priority order (lower
// first; FIFO among equals). Used for decoding, so earlier steps go first.
#ifndef TUTTI_SERVICES_STAGER_DECODE_THREAD_POOL_H_
#define TUTTI_SERVICES_STAGER_DECODE_THREAD_POOL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tutti::stager {

class ThreadPool {
 public:
  explicit ThreadPool(unsigned threads) {
    for (unsigned i = 0; i < std::max(1u, threads); ++i) workers_.emplace_back([this] { Work(); });
  }
  ~ThreadPool() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    for (auto& t : workers_) t.join();
  }
  // Thread-safe. Tasks still queued at destruction are dropped.
  void Submit(uint64_t priority, std::function<void()> task) {
    absl::MutexLock l(&mu_);
    tasks_.emplace(std::make_pair(priority, seq_++), std::move(task));
  }
  size_t size() const { return workers_.size(); }
  // Tasks waiting for a thread. Thread-safe.
  size_t queued() const {
    absl::MutexLock l(&mu_);
    return tasks_.size();
  }

 private:
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); }
  void Work() {
    while (true) {
      std::function<void()> task;
      {
        absl::MutexLock l(&mu_, absl::Condition(this, &ThreadPool::HasWork));
        if (stop_) return;
        task = std::move(tasks_.extract(tasks_.begin()).mapped());
      }
      task();
    }
  }
  mutable absl::Mutex mu_;
  std::map<std::pair<uint64_t, uint64_t>, std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_DECODE_THREAD_POOL_H_
