// libtutti clients for the end-to-end tests.
#ifndef TUTTI_TESTS_E2E_CLIENT_H_
#define TUTTI_TESTS_E2E_CLIENT_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "client/client.h"

namespace tutti::e2e {

// The options of rank `rank` of a `world`-rank test job starting at
// `start_step`: connect within 10 s, each batch within 30 s (tests that need
// other bounds change them).
inline ClientOptions RankOptions(const std::string& stager, const std::string& packer, int rank,
                                 int world, int64_t start_step = 0) {
  ClientOptions o;
  o.stager_address = stager;
  o.packer_address = packer;
  o.rank = rank;
  o.world_size = world;
  o.start_step = start_step;
  o.connect_timeout = absl::Seconds(10);
  o.batch_timeout = absl::Seconds(30);
  return o;
}

}  // namespace tutti::e2e

#endif  // TUTTI_TESTS_E2E_CLIENT_H_
