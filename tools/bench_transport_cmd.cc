// `tutti bench transport`: a plan's all-to-all through MpiTransport, against
// raw MPI_Alltoallv of the same bytes in the same run, so the cost of the
// plan layout and of the cross-rank agreement is visible. Run under mpirun:
//   mpirun -np 4 tutti bench transport --sizes 64K,1M,16M
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/mpi_transport.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tutti/v1/plan.pb.h"

namespace {

bool ParseSize(absl::string_view s, uint64_t* out) {
  uint64_t mult = 1;
  if (!s.empty() && (s.back() == 'K' || s.back() == 'k')) mult = 1ull << 10;
  if (!s.empty() && (s.back() == 'M' || s.back() == 'm')) mult = 1ull << 20;
  if (!s.empty() && (s.back() == 'G' || s.back() == 'g')) mult = 1ull << 30;
  if (mult != 1) s.remove_suffix(1);
  uint64_t v = 0;
  if (!absl::SimpleAtoi(s, &v)) return false;
  *out = v * mult;
  return true;
}

// Every rank sends bytes_per_rank / world to every rank (itself included),
// one item per transfer.
tutti::v1::RankPlan UniformPlan(uint32_t rank, uint32_t world, uint64_t per_peer) {
  tutti::v1::RankPlan plan;
  plan.set_rank(rank);
  plan.set_plan_version(tutti::kMinExchangePlanVersion);
  auto* ex = plan.mutable_exchange();
  for (uint32_t p = 0; p < world; ++p) {
    for (auto* list : {ex->mutable_sends(), ex->mutable_recvs()}) {
      auto* t = list->Add();
      t->set_peer(p);
      t->set_bytes(per_peer);
      auto* item = t->add_items();
      item->set_sample_id(list == ex->mutable_sends() ? rank * world + p : p * world + rank);
      item->set_bytes(per_peer);
    }
  }
  ex->set_send_bytes(per_peer * world);
  ex->set_recv_bytes(per_peer * world);
  return plan;
}

// The slowest rank's seconds for fn().
double SlowestSeconds(const std::function<void()>& fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
         worst = 0;
  MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

// Medians over iterations of the slowest rank's time for each of `fns`,
// run interleaved (each iteration starts with the next one), so that drift
// in the machine's load affects them alike.
std::vector<double> InterleavedMedians(uint32_t iterations, uint32_t warmup,
                                       const std::vector<std::function<void()>>& fns) {
  std::vector<std::vector<double>> times(fns.size());
  for (uint32_t i = 0; i < warmup + iterations; ++i) {
    for (size_t k = 0; k < fns.size(); ++k) {
      const size_t f = (k + i) % fns.size();
      const double t = SlowestSeconds(fns[f]);
      if (i >= warmup) times[f].push_back(t);
    }
  }
  std::vector<double> out;
  for (auto& t : times) {
    std::sort(t.begin(), t.end());
    out.push_back(t[t.size() / 2]);
  }
  return out;
}

int RunBenchExchange(int argc, char** argv) {
  std::string sizes = "0,64K,1M,16M";
  uint32_t iterations = 20, warmup = 3;
  bool json = false;
  tutti::tools::Cli cli(
      "mpirun -np N tutti bench transport [options]",
      "Times the plan's all-to-all through tutti's MPI transport (with and without the\n"
      "cross-rank agreement) against raw MPI_Alltoallv of the same bytes, per size of\n"
      "each rank's send buffer (spread evenly over all ranks). Times are the median over\n"
      "iterations of the slowest rank; the three run interleaved.");
  cli.Flag("sizes", &sizes, "bytes each rank sends, comma-separated (K, M, G suffixes)");
  cli.Flag("iterations", &iterations, "timed iterations per size");
  cli.Flag("warmup", &warmup, "untimed iterations first");
  cli.Flag("json", &json, "print JSON lines instead of a table");
  int rc = 0;
  if (!cli.Parse(argc, argv, &rc)) return rc;
  std::vector<uint64_t> list;
  for (absl::string_view s : absl::StrSplit(sizes, ',', absl::SkipWhitespace())) {
    uint64_t v = 0;
    if (!ParseSize(s, &v)) {
      std::fprintf(stderr, "tutti bench transport: --sizes: cannot read '%s' (e.g. 64K,1M)\n",
                   std::string(s).c_str());
      return 2;
    }
    list.push_back(v);
  }
  if (list.empty() || iterations == 0) {
    std::fprintf(stderr, "tutti bench transport: give at least one size and one iteration\n");
    return 2;
  }
  auto verified = tutti::MpiTransport::CreateWorld();
  if (!verified.ok()) {
    std::fprintf(stderr, "tutti bench transport: %s\n",
                 std::string(verified.status().message()).c_str());
    return 1;
  }
  tutti::MpiTransportOptions raw_opts;
  raw_opts.verify = false;
  auto unverified = tutti::MpiTransport::CreateWorld(raw_opts);
  if (!unverified.ok()) return 1;
  const uint32_t rank = (*verified)->rank(), world = (*verified)->world_size();
  if (rank == 0 && !json) {
    std::printf("%u ranks, %u iterations (median of the slowest rank)\n", world, iterations);
    std::printf("%12s %12s %12s %12s %10s %10s %9s\n", "send_bytes", "alltoallv_us",
                "unverified_us", "verified_us", "GB/s_raw", "GB/s_tutti", "overhead");
  }
  for (uint64_t bytes : list) {
    const uint64_t per_peer = bytes / world;
    const tutti::v1::RankPlan plan = UniformPlan(rank, world, per_peer);
    std::vector<char> send(per_peer * world, static_cast<char>(rank)), recv(per_peer * world);
    std::vector<int> counts(world, static_cast<int>(per_peer)), displs(world);
    for (uint32_t p = 0; p < world; ++p) displs[p] = static_cast<int>(p * per_peer);
    const tutti::ExchangeContext ctx{0, world};
    absl::Status status;
    const std::vector<double> medians = InterleavedMedians(
        iterations, warmup,
        {[&] {
           MPI_Alltoallv(send.data(), counts.data(), displs.data(), MPI_BYTE, recv.data(),
                         counts.data(), displs.data(), MPI_BYTE, MPI_COMM_WORLD);
         },
         [&] {
           absl::Status s =
               (*unverified)
                   ->Exchange(plan, send.data(), send.size(), recv.data(), recv.size(), ctx);
           if (!s.ok()) status = s;
         },
         [&] {
           absl::Status s =
               (*verified)->Exchange(plan, send.data(), send.size(), recv.data(), recv.size(), ctx);
           if (!s.ok()) status = s;
         }});
    const double raw = medians[0], plain = medians[1], agreed = medians[2];
    if (!status.ok()) {
      std::fprintf(stderr, "tutti bench transport rank %u: %s\n", rank,
                   std::string(status.message()).c_str());
      return 1;
    }
    const double moved = static_cast<double>(per_peer) * world * world;  // all ranks' bytes
    if (rank != 0) continue;
    if (json) {
      std::printf(
          "{\"ranks\":%u,\"send_bytes\":%llu,\"alltoallv_s\":%.9f,\"unverified_s\":%.9f,"
          "\"verified_s\":%.9f,\"verified_over_alltoallv\":%.4f}\n",
          world, static_cast<unsigned long long>(per_peer * world), raw, plain, agreed,
          agreed / raw);
    } else {
      std::printf("%12llu %12.1f %12.1f %12.1f %10.2f %10.2f %8.2fx\n",
                  static_cast<unsigned long long>(per_peer * world), raw * 1e6, plain * 1e6,
                  agreed * 1e6, moved / raw / 1e9, moved / agreed / 1e9, agreed / raw);
    }
  }
  return 0;
}

}  // namespace

TUTTI_COMMAND("bench transport", "time the MPI transport against raw MPI_Alltoallv by message size",
              RunBenchExchange);
