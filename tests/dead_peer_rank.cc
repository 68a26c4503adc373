// A rank of tests/dead_peer_test.cc, run under mpirun: one verified exchange
// with every rank, then the last rank exits without a word (as a crashed
// process does) while the others start the next exchange. Each survivor
// prints "rank R: <status of that exchange>", then ends the job through
// FinishMpi: MPI_Abort with code 3 when the transport reported the dead rank
// by number within the bound, 1 otherwise.
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "client/examples/rank_step.h"
#include "client/exchange_pattern.h"
#include "client/mpi_transport.h"
#include "client/testing/random_exchange.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  tutti::MpiTransportOptions o;
  o.join_timeout = absl::Seconds(2);
  auto t = tutti::MpiTransport::Create(MPI_COMM_WORLD, o);
  if (!t.ok()) {
    std::fprintf(stderr, "transport: %s\n", std::string(t.status().message()).c_str());
    return 1;
  }
  const uint32_t rank = (*t)->rank(), world = (*t)->world_size(), dead = world - 1;
  tutti::RandomExchangeOptions ro;
  ro.world_size = world;
  ro.seed = 5;
  ro.empty_pair_fraction = 0;
  const auto plans = tutti::RandomExchangePlans(ro);
  absl::Status first =
      tutti::ExchangeAndVerify(**t, plans[rank], tutti::ExchangeContext{1, world}, nullptr);
  if (!first.ok()) {
    std::fprintf(stderr, "rank %u: first exchange: %s\n", rank,
                 std::string(first.message()).c_str());
    return 1;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == dead) _exit(0);  // no MPI_Finalize: a crash as far as the others can tell
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s =
      tutti::ExchangeAndVerify(**t, plans[rank], tutti::ExchangeContext{2, world}, nullptr);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("rank %u: %s (after %.1f s)\n", rank, s.ToString().c_str(), seconds);
  std::fflush(stdout);
  const std::string needle = "rank(s) " + std::to_string(dead) + " did not join the exchange";
  const bool named =
      absl::IsDeadlineExceeded(s) && s.message().find(needle) != absl::string_view::npos;
  // The job cannot go on without the dead rank: FinishMpi aborts it (code 3
  // when the dead rank was named) instead of finalising, which would wait.
  // The first abort ends every survivor: give the others' lines (they time
  // out together, give or take a loaded machine) time to reach mpirun first.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  tutti::FinishMpi(named ? 3 : 1);
  return 1;
}
