// ThreadSanitizer builds only: the shared library's implementation of a
// function the program defines itself (tsan_absl_sync.cc, tsan_grpc.cc),
// looked up on first use with dlsym(RTLD_NEXT).
#ifndef TUTTI_CMAKE_SANITIZERS_TSAN_REAL_H_
#define TUTTI_CMAKE_SANITIZERS_TSAN_REAL_H_

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace tutti_tsan {

// The function whose mangled name is head() + tail (head may be null).
template <typename Fn>
class Real {
 public:
  constexpr Real(std::string (*head)(), const char* tail) : head_(head), tail_(tail) {}
  Fn get() {
    void* f = fn_.load(std::memory_order_acquire);
    if (f == nullptr) {
      const std::string name = (head_ != nullptr ? head_() : std::string()) + tail_;
      f = dlsym(RTLD_NEXT, name.c_str());
      if (f == nullptr) {
        std::fprintf(stderr, "tsan: %s not found in the libraries after the program\n",
                     name.c_str());
        std::abort();
      }
      fn_.store(f, std::memory_order_release);
    }
    return reinterpret_cast<Fn>(f);
  }

 private:
  std::string (*const head_)();
  const char* const tail_;
  std::atomic<void*> fn_{nullptr};
};

}  // namespace tutti_tsan

#endif  // TUTTI_CMAKE_SANITIZERS_TSAN_REAL_H_
