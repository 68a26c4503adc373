// A fixed pool of worker threads running tasks in priority order (lower
// first; FIFO among equals). Used for decoding, so earlier steps go first.
#ifndef TUTTI_SERVICES_STAGER_THREAD_POOL_H_
#define TUTTI_SERVICES_STAGER_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace tutti::stager {

class ThreadPool {
 public:
  explicit ThreadPool(unsigned threads) {
    for (unsigned i = 0; i < std::max(1u, threads); ++i) workers_.emplace_back([this] { Work(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  // Thread-safe. Tasks still queued at destruction are dropped.
  void Submit(uint64_t priority, std::function<void()> task) {
    {
      std::lock_guard<std::mutex> l(mu_);
      tasks_.emplace(std::make_pair(priority, seq_++), std::move(task));
    }
    cv_.notify_one();
  }
  size_t size() const { return workers_.size(); }

 private:
  void Work() {
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      cv_.wait(l, [&] { return stop_ || !tasks_.empty(); });
      if (stop_) return;
      auto node = tasks_.extract(tasks_.begin());
      l.unlock();
      node.mapped()();
      l.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<uint64_t, uint64_t>, std::function<void()>> tasks_;  // guarded by mu_
  uint64_t seq_ = 0;                                                        // guarded by mu_
  bool stop_ = false;                                                       // guarded by mu_
  std::vector<std::thread> workers_;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_THREAD_POOL_H_
