// Random but consistent exchange plans for a whole job, for tests: what rank
// a sends rank b is exactly what rank b expects from rank a.
#ifndef TUTTI_CLIENT_TESTING_RANDOM_EXCHANGE_H_
#define TUTTI_CLIENT_TESTING_RANDOM_EXCHANGE_H_

#include <cstdint>
#include <vector>

#include "tutti/v1/plan.pb.h"

namespace tutti {

struct RandomExchangeOptions {
  uint32_t world_size = 4;
  uint64_t seed = 1;
  uint32_t max_items_per_pair = 3;   // 0..this items from each rank to each rank (itself included)
  uint64_t max_item_bytes = 4096;    // item sizes uniform in [0, this]
  double empty_pair_fraction = 0.3;  // pairs with no transfer at all
};

// One RankPlan per rank, laid out as plan_version 4 (plan.proto Exchange):
// rank, plan_version, exchange sends/recvs/totals, a pair's vision items
// before its audio items, and the encoder phases listing each encoder's
// items in the order of the sends.
std::vector<v1::RankPlan> RandomExchangePlans(const RandomExchangeOptions& opts);

}  // namespace tutti

#endif  // TUTTI_CLIENT_TESTING_RANDOM_EXCHANGE_H_
