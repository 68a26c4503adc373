#include "services/packer/core/post_balancing/move_lists.h"

#include <utility>

namespace tutti::dispatch {
namespace {

// Stable counting sort of move indices by key(move) in [0, keys).
template <typename Key>
std::vector<uint32_t> StableBy(const std::vector<uint32_t>& in, uint32_t keys, Key key) {
  std::vector<uint32_t> count(keys + 1, 0);
  for (uint32_t m : in) ++count[key(m) + 1];
  for (uint32_t k = 0; k < keys; ++k) count[k + 1] += count[k];
  std::vector<uint32_t> out(in.size());
  for (uint32_t m : in) out[count[key(m)]++] = m;
  return out;
}

// Appends the moves (sorted by (owner, peer, original order)) as transfers,
// sizing every list before filling it.
template <typename Owner, typename Peer>
void Group(const std::vector<Move>& moves, const std::vector<uint32_t>& sorted, Owner owner,
           Peer peer, std::vector<RankExchange>* out, bool sends) {
  // Pass 1: transfers per owner.
  std::vector<uint32_t> transfers(out->size(), 0);
  for (size_t k = 0; k < sorted.size(); ++k) {
    const uint32_t m = sorted[k];
    if (k == 0 || owner(sorted[k - 1]) != owner(m) || peer(sorted[k - 1]) != peer(m)) {
      ++transfers[owner(m)];
    }
  }
  for (size_t r = 0; r < out->size(); ++r) {
    (sends ? (*out)[r].sends : (*out)[r].recvs).reserve(transfers[r]);
  }
  // Pass 2: one run of equal (owner, peer) per transfer.
  for (size_t k = 0; k < sorted.size();) {
    const uint32_t o = owner(sorted[k]), p = peer(sorted[k]);
    size_t end = k;
    while (end < sorted.size() && owner(sorted[end]) == o && peer(sorted[end]) == p) ++end;
    RankExchange& x = (*out)[o];
    Transfer t;
    t.peer = p;
    t.items.reserve(end - k);
    for (; k < end; ++k) {
      t.bytes += moves[sorted[k]].item.bytes;
      t.items.push_back(moves[sorted[k]].item);
    }
    (sends ? x.send_bytes : x.recv_bytes) += t.bytes;
    (sends ? x.sends : x.recvs).push_back(std::move(t));
  }
}

}  // namespace

std::vector<RankExchange> BuildExchange(const ClusterShape& cluster,
                                        const std::vector<Move>& moves) {
  const uint32_t W = cluster.world_size;
  std::vector<RankExchange> out(W);
  std::vector<uint32_t> idx(moves.size());
  for (uint32_t m = 0; m < moves.size(); ++m) idx[m] = m;
  auto src = [&](uint32_t m) { return moves[m].src; };
  auto dst = [&](uint32_t m) { return moves[m].dst; };
  const auto by_src_dst = StableBy(StableBy(idx, W, dst), W, src);
  Group(moves, by_src_dst, src, dst, &out, /*sends=*/true);
  const auto by_dst_src = StableBy(StableBy(idx, W, src), W, dst);
  Group(moves, by_dst_src, dst, src, &out, /*sends=*/false);
  for (uint32_t r = 0; r < W; ++r) {
    for (const Transfer& t : out[r].sends) {
      if (cluster.node_of(t.peer) != cluster.node_of(r)) out[r].inter_node_send_bytes += t.bytes;
    }
  }
  return out;
}

std::vector<RankExchange> InverseExchange(const ClusterShape& cluster,
                                          const std::vector<RankExchange>& forward) {
  std::vector<RankExchange> back(forward.size());
  for (uint32_t r = 0; r < forward.size(); ++r) {
    back[r].sends = forward[r].recvs;
    back[r].recvs = forward[r].sends;
    back[r].send_bytes = forward[r].recv_bytes;
    back[r].recv_bytes = forward[r].send_bytes;
    for (const Transfer& t : back[r].sends) {
      if (cluster.node_of(t.peer) != cluster.node_of(r)) back[r].inter_node_send_bytes += t.bytes;
    }
  }
  return back;
}

ExchangeTotals SumExchange(const ClusterShape& cluster, const std::vector<RankExchange>& exchange) {
  ExchangeTotals t;
  for (uint32_t r = 0; r < exchange.size(); ++r) {
    for (const Transfer& s : exchange[r].sends) {
      if (s.peer == r) {
        t.self += s.bytes;
      } else if (cluster.node_of(s.peer) == cluster.node_of(r)) {
        t.intra_node += s.bytes;
      } else {
        t.inter_node += s.bytes;
      }
    }
  }
  return t;
}

}  // namespace tutti::dispatch
