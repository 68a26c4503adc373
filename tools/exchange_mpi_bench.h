// `tutti bench exchange --transport mpi`: a post-balancing plan's exchange run
// through the client library's MpiTransport (Transport::Exchange and
// ExchangeBackward: layout, size checks, cross-rank agreement, one message
// per peer), each encoder's straight from and into that encoder's output
// (EncoderPhase order, grouped by destination), and through a bare
// MPI_Alltoallv of exactly the same counts and offsets, interleaved in the
// same run, on every rank of MPI_COMM_WORLD (start it under mpirun with as
// many ranks as the plan has).
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
// timing, each encoder's forward and backward exchanges run once with every
// byte checked (client/exchange_pattern.h; a wrong byte fails the row) and
// the client's messages counted (messages_per_pair). Timing: per iteration
// the slowest rank's time for every encoder's forward and backward exchange
// (barrier, exchanges, max over ranks), client and bare alternating which
// goes first; throughput is all ranks' bytes (both directions) over the
// median time, and client_vs_bare_throughput is bare median / client
// median. bytes_per_rank_max: the largest forward send bytes of a rank.
// The rank's exchange lists are those of the StepPlan tutti-packerd would
// serve for this plan (packer/plan_proto.h).
absl::StatusOr<packer::TransportBenchResult> RunMpiExchangeBench(
    const MpiExchangeBenchOptions& options, const packer::Job& job,
    const packer::StepPlanData& plan);

}  // namespace tutti::tools

#endif  // TUTTI_TOOLS_EXCHANGE_MPI_BENCH_H_
