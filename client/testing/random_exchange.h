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
  // Split each pair's items into runs of random lengths (Transfer.runs, the
  // same on both ends); false: no runs. The items drawn do not depend on it.
  bool runs = false;
};

// One RankPlan per rank (rank, exchange sends/recvs/totals filled in).
std::vector<v1::RankPlan> RandomExchangePlans(const RandomExchangeOptions& opts);

}  // namespace tutti

#endif  // TUTTI_CLIENT_TESTING_RANDOM_EXCHANGE_H_
