// How an exchange's bytes become the MPI transport's messages: one per peer
// from contiguous buffers, one per run (or item) item by item, with the
// staging of runs not contiguous in this rank's memory.
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
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

// The memory item-wise exchanges own: zeros sent for a lone item without
// memory, scratch that receives one, and the staging of runs that are not
// contiguous in this rank's memory. Zeros and scratch are apart (a receive
// must not overwrite what another message still sends). Reused by the next
// exchange (it grows to the largest need) unless a failed exchange left it
// to a late peer.
struct MpiTransport::ItemStaging {
  std::vector<char> zeros;
  std::vector<char> scratch;
  std::vector<char> runs;
};

MpiTransport::Messages MpiTransport::ItemMessages(
    const ExchangeLayout& layout, const std::vector<std::vector<ItemBuffer>>& send,
    const std::vector<std::vector<ItemBuffer>>& recv) {
  // A message per run (a run of one item without runs), read and written in
  // place where the run's items lie back to back in this rank's memory, else
  // through staging memory: gathered before the send, scattered once every
  // message completed. A pair's runs go in plan order on both ends, and
  // messages with one tag between two ranks do not overtake each other.
  struct Run {
    bool receive;
    uint32_t peer;
    const std::vector<ItemBuffer>* items;
    size_t first, end;  // items[first, end)
    char* start;        // in place; nullptr: staged, or lone items
    uint64_t bytes;
    bool staged;
  };
  std::vector<Run> runs;
  uint64_t zeros = 0, scratch = 0, staged = 0;
  auto plan = [&](bool receive, uint32_t p, const std::vector<ItemBuffer>& items,
                  const std::vector<uint32_t>& lengths) {
    uint64_t& spare = receive ? scratch : zeros;  // for lone items without memory
    for (const ItemBuffer& b : items) {
      if (b.data == nullptr) spare = std::max(spare, b.bytes);
    }
    size_t next = 0;
    for (size_t r = 0; next < items.size(); ++r) {
      const size_t n = r < lengths.size() ? std::max<uint32_t>(lengths[r], 1) : 1;
      Run run{receive, p, &items, next, std::min(items.size(), next + n), nullptr, 0, false};
      size_t filled = 0;
      bool contiguous = true;
      char* after = nullptr;
      for (size_t k = run.first; k < run.end; ++k) {
        const ItemBuffer& b = items[k];
        if (b.bytes == 0) continue;
        auto* d = static_cast<char*>(b.data);
        contiguous = contiguous && d != nullptr && (run.start == nullptr || d == after);
        if (contiguous) {
          if (run.start == nullptr) run.start = d;
          after = d + b.bytes;
        }
        run.bytes += b.bytes;
        ++filled;
      }
      if (filled <= 1) {
        run.start = nullptr;  // lone items: a message each, as without runs
      } else if (!contiguous) {
        run.start = nullptr;
        run.staged = true;
        staged += run.bytes;
      }
      runs.push_back(run);
      next = run.end;
    }
  };
  for (uint32_t k = 1; k < size_; ++k) {
    const uint32_t p = (rank_ + size_ - k) % size_;
    plan(true, p, recv[p], layout.recv_runs[p]);
  }
  for (uint32_t k = 1; k < size_; ++k) {
    const uint32_t p = (rank_ + k) % size_;
    plan(false, p, send[p], layout.send_runs[p]);
  }
  // Only this transport holds its staging unless a failed exchange left it
  // to a late peer (the transport then refuses further exchanges anyway).
  if (staging_ == nullptr || staging_.use_count() > 1) staging_ = std::make_shared<ItemStaging>();
  ItemStaging& st = *staging_;
  // Zeros are never written, so what is kept of them stays zero.
  if (st.zeros.size() < zeros) st.zeros.resize(zeros);
  if (st.scratch.size() < scratch) st.scratch.resize(scratch);
  if (st.runs.size() < staged) st.runs.resize(staged);
  Messages m;
  m.spare = staging_;
  char* at = st.runs.data();
  for (const Run& run : runs) {
    const std::vector<ItemBuffer>& items = *run.items;
    if (run.start != nullptr) {
      m.pieces.push_back({run.receive, run.peer, run.start, run.bytes});
    } else if (!run.staged) {
      for (size_t k = run.first; k < run.end; ++k) {
        const ItemBuffer& b = items[k];
        if (b.bytes == 0) continue;
        char* missing = run.receive ? st.scratch.data() : st.zeros.data();
        m.pieces.push_back(
            {run.receive, run.peer, b.data ? static_cast<char*>(b.data) : missing, b.bytes});
      }
    } else {
      char* buf = at;
      for (size_t k = run.first; k < run.end; ++k) {
        const ItemBuffer& b = items[k];
        if (b.bytes == 0) continue;
        if (run.receive) {
          if (b.data != nullptr) m.scatter.push_back({static_cast<char*>(b.data), at, b.bytes});
        } else if (b.data != nullptr) {
          std::memcpy(at, b.data, b.bytes);
        } else {
          std::memset(at, 0, b.bytes);
        }
        at += b.bytes;
      }
      m.pieces.push_back({run.receive, run.peer, buf, run.bytes});
    }
  }
  // This rank's own items are copied one by one, in or out of place.
  const auto& to_self = send[rank_];
  const auto& from_self = recv[rank_];
  for (size_t k = 0; k < std::min(to_self.size(), from_self.size()); ++k) {
    if (from_self[k].data == nullptr) continue;
    m.own.push_back({static_cast<char*>(from_self[k].data),
                     static_cast<const char*>(to_self[k].data), from_self[k].bytes});
  }
  return m;
}

}  // namespace tutti
