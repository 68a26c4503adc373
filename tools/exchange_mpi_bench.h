// `tutti bench exchange --transport mpi`: a post-balancing plan's forward
// exchange run through the client library's MpiTransport (Transport::Exchange:
// layout, size checks, cross-rank agreement, MPI_Alltoallv) and through a
// bare MPI_Alltoallv of exactly the same counts and offsets, interleaved in
// the same run, on every rank of MPI_COMM_WORLD (start it under mpirun with
// as many ranks as the plan has).
#ifndef TUTTI_TOOLS_EXCHANGE_MPI_BENCH_H_
#define TUTTI_TOOLS_EXCHANGE_MPI_BENCH_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "services/packer/bench/exchange_bench.h"

namespace tutti::tools {

struct MpiExchangeBenchOptions {
  uint32_t iterations = 20;  // timed exchanges of each kind (medians reported); default 20
  uint32_t warmup = 3;       // untimed exchanges of each kind first; default 3
};

struct MpiWorld {
  uint32_t rank = 0;
  uint32_t size = 1;
};

// Initialises MPI (once) and returns this process's place in MPI_COMM_WORLD.
absl::StatusOr<MpiWorld> InitMpiWorld();

// Collective over MPI_COMM_WORLD for every plan it is called with. Before
// timing, the forward and backward exchanges run once with every byte
// checked (client/exchange_pattern.h); a wrong byte fails the row. Timing:
// per iteration the slowest rank's time (barrier, exchange, max over
// ranks), client and bare alternating which goes first; throughput is all
// ranks' send bytes over the median time, and client_vs_bare_throughput is
// bare median / client median.
// The rank's exchange lists are those of the StepPlan tutti-packerd would
// serve for this plan (packer/plan_proto.h).
absl::StatusOr<packer::TransportBenchResult> RunMpiExchangeBench(
    const MpiExchangeBenchOptions& options, const packer::Job& job,
    const packer::StepPlanData& plan);

}  // namespace tutti::tools

#endif  // TUTTI_TOOLS_EXCHANGE_MPI_BENCH_H_
