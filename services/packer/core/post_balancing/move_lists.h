// Turning per-item moves into all-to-all send/receive lists (the layout of
// tutti.v1.Exchange), inverting them for the backward pass, and totals.
#ifndef TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_MOVE_LISTS_H_
#define TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_MOVE_LISTS_H_

#include <cstdint>
#include <vector>

#include "services/packer/core/post_balancing/dispatch_types.h"

namespace tutti::dispatch {

struct Move {
  uint32_t src = 0;
  uint32_t dst = 0;
  ExchangeItem item;
};

// Per rank: sends grouped by destination and receives grouped by source, both
// in increasing peer order (self included when it has items; peers without
// items are left out). Moves sharing (src, dst) keep their relative order, so
// a sender's transfer and the receiver's matching transfer list the same
// items in the same order. O(moves + world_size).
std::vector<RankExchange> BuildExchange(const ClusterShape& cluster,
                                        const std::vector<Move>& moves);

// The backward exchange of `forward`: every send becomes a receive of the
// same items and bytes (gradients of the encoder outputs flow LLM rank ->
// encoder rank), with the same per-peer order.
std::vector<RankExchange> InverseExchange(const ClusterShape& cluster,
                                          const std::vector<RankExchange>& forward);

struct ExchangeTotals {
  uint64_t inter_node = 0;  // between ranks on different nodes
  uint64_t intra_node = 0;  // between different ranks of one node
  uint64_t self = 0;        // rank to itself (a local copy)
};
ExchangeTotals SumExchange(const ClusterShape& cluster, const std::vector<RankExchange>& exchange);

}  // namespace tutti::dispatch

#endif  // TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_MOVE_LISTS_H_
