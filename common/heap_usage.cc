#include "common/heap_usage.h"

#include <malloc.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TUTTI_SANITIZER_HEAP 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TUTTI_SANITIZER_HEAP 1
#endif
#endif

#ifdef TUTTI_SANITIZER_HEAP
#include <sanitizer/allocator_interface.h>
#endif

namespace tutti {

uint64_t HeapInUseBytes() {
#ifdef TUTTI_SANITIZER_HEAP
  return __sanitizer_get_current_allocated_bytes();
#else
  const struct mallinfo2 m = ::mallinfo2();
  return m.uordblks + m.hblkhd;
#endif
}

}  // namespace tutti
