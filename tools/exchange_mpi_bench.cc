#include "tools/exchange_mpi_bench.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/exchange_layout.h"
#include "client/exchange_pattern.h"
#include "client/mpi_transport.h"
#include "common/status.h"
#include "services/packer/plan_proto.h"

namespace tutti::tools {
namespace {

// The slowest rank's seconds for fn().
template <typename Fn>
double SlowestSeconds(Fn&& fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double worst = 0;
  MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Whether every rank's status is OK; the first failing rank's message on
// all ranks otherwise (so that every rank leaves the row alike).
absl::Status AllOk(const absl::Status& mine) {
  int bad = mine.ok() ? 0 : 1, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any == 0) return absl::OkStatus();
  return mine.ok() ? absl::AbortedError("another rank failed this exchange check") : mine;
}

}  // namespace

absl::StatusOr<MpiWorld> InitMpiWorld() {
  RETURN_IF_ERROR(EnsureMpiInitialized());
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return MpiWorld{static_cast<uint32_t>(rank), static_cast<uint32_t>(size)};
}

absl::StatusOr<packer::TransportBenchResult> RunMpiExchangeBench(const MpiExchangeBenchOptions& o,
                                                                 const packer::Job& job,
                                                                 const packer::StepPlanData& plan) {
  ASSIGN_OR_RETURN(const MpiWorld world, InitMpiWorld());
  static MpiTransport* transport = [] {
    auto t = MpiTransport::CreateWorld();
    return t.ok() ? t->release() : nullptr;
  }();
  if (transport == nullptr) return absl::InternalError("could not create the MPI transport");
  const uint32_t W = plan.world_size, rank = world.rank;
  if (W != world.size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the plan is for ", W, " ranks but mpirun started ", world.size, "; run `mpirun -np ", W,
        " tutti bench exchange --transport mpi --ranks ", W, "`"));
  }
  v1::StepPlan step;
  const uint32_t ranks[] = {rank};
  RETURN_IF_ERROR(packer::BuildStepPlan(job, plan, ranks, &step));
  const v1::RankPlan& rp = step.ranks(0);
  const v1::Exchange& x = rp.exchange();
  const ExchangeContext ctx{0, W};

  // Every byte, forward and backward, through the client's transport.
  std::vector<uint8_t> send(x.send_bytes()), recv(x.recv_bytes(), 0xAB);
  absl::Status s = FillPattern(x.sends(), kForwardSalt, send.data(), send.size());
  if (s.ok()) s = transport->Exchange(rp, send.data(), send.size(), recv.data(), recv.size(), ctx);
  if (s.ok()) s = VerifyPattern(x.recvs(), kForwardSalt, recv.data(), recv.size());
  std::vector<uint8_t> grad(x.recv_bytes()), back(x.send_bytes(), 0xCD);
  if (s.ok()) s = FillPattern(x.recvs(), kBackwardSalt, grad.data(), grad.size());
  if (s.ok()) {
    s = transport->ExchangeBackward(rp, grad.data(), grad.size(), back.data(), back.size(), ctx);
  }
  if (s.ok()) s = VerifyPattern(x.sends(), kBackwardSalt, back.data(), back.size());
  RETURN_IF_ERROR(AllOk(Annotate(s, absl::StrCat("rank ", rank, " checking every byte"))));

  // The bare baseline: the same counts and offsets straight to MPI.
  absl::StatusOr<ExchangeLayout> layout =
      BuildExchangeLayout(rp, ExchangeDirection::kForward, rank, W, ctx);
  absl::Status fits = layout.status();
  std::vector<int> sc(W), sd(W), rc(W), rd(W);
  if (fits.ok()) {
    for (uint32_t p = 0; p < W && fits.ok(); ++p) {
      if (layout->send_offsets[p] + layout->send_counts[p] > INT_MAX ||
          layout->recv_offsets[p] + layout->recv_counts[p] > INT_MAX) {
        fits = absl::OutOfRangeError(
            "a rank exchanges more than 2 GiB: too large for a bare MPI_Alltoallv baseline; "
            "lower --hidden-size");
      }
      sc[p] = static_cast<int>(layout->send_counts[p]);
      sd[p] = static_cast<int>(layout->send_offsets[p]);
      rc[p] = static_cast<int>(layout->recv_counts[p]);
      rd[p] = static_cast<int>(layout->recv_offsets[p]);
    }
  }
  RETURN_IF_ERROR(AllOk(fits));
  static char empty;
  auto bare = [&] {
    MPI_Alltoallv(send.empty() ? &empty : static_cast<void*>(send.data()), sc.data(), sd.data(),
                  MPI_BYTE, recv.empty() ? &empty : static_cast<void*>(recv.data()), rc.data(),
                  rd.data(), MPI_BYTE, MPI_COMM_WORLD);
  };
  absl::Status failed;
  auto client = [&] {
    absl::Status e =
        transport->Exchange(rp, send.data(), send.size(), recv.data(), recv.size(), ctx);
    if (!e.ok()) failed = e;
  };
  std::vector<double> client_s, bare_s;
  for (uint32_t i = 0; i < o.warmup + o.iterations; ++i) {
    double c, b;
    if (i % 2 == 0) {
      c = SlowestSeconds(client);
      b = SlowestSeconds(bare);
    } else {
      b = SlowestSeconds(bare);
      c = SlowestSeconds(client);
    }
    if (i >= o.warmup) client_s.push_back(c), bare_s.push_back(b);
  }
  RETURN_IF_ERROR(AllOk(failed));
  double mine = static_cast<double>(x.send_bytes()), all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  packer::TransportBenchResult r;
  const double c = Median(client_s), b = Median(bare_s);
  r.client_gbps = c > 0 ? all / c / 1e9 : 0;
  r.bare_gbps = b > 0 ? all / b / 1e9 : 0;
  r.client_vs_bare_throughput = c > 0 ? b / c : 0;
  r.bytes_per_rank_max = 0;
  double max_bytes = 0;
  MPI_Allreduce(&mine, &max_bytes, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  r.bytes_per_rank_max = static_cast<uint64_t>(max_bytes);
  r.client_seconds = c;
  r.bare_seconds = b;
  return r;
}

}  // namespace tutti::tools
