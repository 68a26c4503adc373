// How many bytes the heap holds for the program: for reporting what a
// component allocates (the packer's index and job at load) and for tests
// that bound it.
#ifndef TUTTI_COMMON_HEAP_USAGE_H_
#define TUTTI_COMMON_HEAP_USAGE_H_

#include <cstdint>

namespace tutti {

// Bytes allocated and not freed, all threads: glibc malloc's figure
// (mallinfo2: uordblks + hblkhd), or in an AddressSanitizer or
// ThreadSanitizer build its allocator's. Walks the allocator's arenas:
// for occasional use, not a hot path.
uint64_t HeapInUseBytes();

}  // namespace tutti

#endif  // TUTTI_COMMON_HEAP_USAGE_H_
