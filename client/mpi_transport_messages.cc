// How an exchange's bytes become the MPI transport's messages: one per peer
// with bytes, straight between the caller's buffers.
#include <vector>

#include "client/mpi_transport.h"

namespace tutti {

MpiTransport::Messages MpiTransport::ContiguousMessages(const ExchangeLayout& layout,
                                                        const void* send, void* recv) const {
  auto* in = static_cast<char*>(const_cast<void*>(send));
  auto* out = static_cast<char*>(recv);
  Messages m;
  // Receives first, then sends, each rank starting with a different peer.
  for (uint32_t k = 1; k < size_; ++k) {
    const uint32_t p = (rank_ + size_ - k) % size_;
    if (layout.recv_counts[p] > 0) {
      m.pieces.push_back({true, p, out + layout.recv_offsets[p], layout.recv_counts[p]});
    }
  }
  for (uint32_t k = 1; k < size_; ++k) {
    const uint32_t p = (rank_ + k) % size_;
    if (layout.send_counts[p] > 0) {
      m.pieces.push_back({false, p, in + layout.send_offsets[p], layout.send_counts[p]});
    }
  }
  if (layout.send_counts[rank_] > 0) {
    m.own.push_back({out + layout.recv_offsets[rank_], in + layout.send_offsets[rank_],
                     layout.send_counts[rank_]});
  }
  return m;
}

}  // namespace tutti
