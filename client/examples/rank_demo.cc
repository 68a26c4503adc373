// tutti-rank-demo: a training rank without the model. Under mpirun, each rank
// connects to its node's stager and the job's packer, pulls its batch for
// every step, runs the plan's forward and backward exchange with buffers whose
// every byte is checked on arrival, reports timings, and rank 0 prints one
// table row per rank and step. Exits non-zero on any error or wrong byte.
//
//   mpirun -np 4 tutti-rank-demo --stager 127.0.0.1:7071 --packer 127.0.0.1:7070 --steps 20
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "client/client.h"
#include "client/examples/rank_step.h"
#include "client/mpi_transport.h"

ABSL_FLAG(std::string, stager, "",
          "this node's tutti-stagerd, host:port (default: $TUTTI_STAGER); or one per node, "
          "comma-separated, ranks filling nodes in contiguous blocks");
ABSL_FLAG(std::string, packer, "", "the job's tutti-packerd, host:port (default: $TUTTI_PACKER)");
ABSL_FLAG(int64_t, start_step, 0, "first step to pull");
ABSL_FLAG(int64_t, steps, 20, "steps to run");
ABSL_FLAG(double, connect_timeout_s, 60, "seconds to keep trying to reach the packer and stager");
ABSL_FLAG(double, batch_timeout_s, 600, "seconds to wait for one batch");
ABSL_FLAG(double, join_timeout_s, 120, "seconds an exchange waits for every rank to arrive");
ABSL_FLAG(bool, report, true, "report step timings to the packer");

namespace {

// True on every rank when `ok` is true on every rank.
bool AllOk(bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

int Run() {
  auto transport_or = tutti::MpiTransport::CreateWorld(
      {.join_timeout = absl::Seconds(absl::GetFlag(FLAGS_join_timeout_s))});
  if (!transport_or.ok()) {
    std::fprintf(stderr, "tutti-rank-demo: %s\n",
                 std::string(transport_or.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<tutti::MpiTransport> transport = std::move(*transport_or);
  const uint32_t rank = transport->rank(), world = transport->world_size();

  auto stager = tutti::StagerForRank(absl::GetFlag(FLAGS_stager), rank, world);
  if (!stager.ok()) {
    if (rank == 0)
      std::fprintf(stderr, "tutti-rank-demo: %s\n", std::string(stager.status().message()).c_str());
    return 2;
  }
  tutti::ClientOptions opts;
  opts.stager_address = *stager;
  opts.packer_address = absl::GetFlag(FLAGS_packer);
  opts.rank = static_cast<int>(rank);
  opts.world_size = static_cast<int>(world);
  opts.start_step = absl::GetFlag(FLAGS_start_step);
  opts.connect_timeout = absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s));
  opts.batch_timeout = absl::Seconds(absl::GetFlag(FLAGS_batch_timeout_s));
  auto client_or = tutti::Client::Connect(opts);
  if (!client_or.ok()) {
    std::fprintf(stderr, "tutti-rank-demo rank %u: %s\n", rank,
                 std::string(client_or.status().message()).c_str());
  }
  if (!AllOk(client_or.ok())) return 1;
  std::unique_ptr<tutti::Client> client = std::move(*client_or);
  client->SetTransport(std::move(transport));

  if (rank == 0) std::printf("%s\n", tutti::StepTableHeader().c_str());
  std::vector<tutti::StepRow> rows(world);
  double wait_total = 0, exchange_total = 0;
  uint64_t bytes_total = 0;
  const int64_t want = absl::GetFlag(FLAGS_steps);
  int64_t steps = 0;  // run
  for (; steps < want; ++steps) {
    const auto step_start = std::chrono::steady_clock::now();
    auto batch = client->Next();
    // The job's end (every rank past its last step) ends the run, with the
    // summary of the steps there were; one rank alone there is an error.
    const int past_end = !batch.ok() && absl::IsOutOfRange(batch.status()) ? 1 : 0;
    int ranks_past_end = 0;
    MPI_Allreduce(&past_end, &ranks_past_end, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (ranks_past_end == static_cast<int>(world)) {
      if (rank == 0) {
        std::printf("the job ends here: %s; stopping after %lld of the %lld steps asked for\n",
                    std::string(batch.status().message()).c_str(), static_cast<long long>(steps),
                    static_cast<long long>(want));
      }
      break;
    }
    if (!batch.ok()) {
      std::fprintf(stderr, "tutti-rank-demo rank %u: %s\n", rank,
                   std::string(batch.status().message()).c_str());
    }
    if (!AllOk(batch.ok())) return 1;
    tutti::StepRow row = tutti::SummarizeBatch(*batch);
    double exchange_s = 0;
    absl::Status s = tutti::ExchangeAndVerify(
        *client->transport(), batch->plan(),
        tutti::ExchangeContext{batch->step(), client->world_size()}, &exchange_s);
    if (!s.ok())
      std::fprintf(stderr, "tutti-rank-demo rank %u: %s\n", rank, std::string(s.message()).c_str());
    if (!AllOk(s.ok())) return 1;
    row.exchange_ms = exchange_s * 1e3;
    wait_total += batch->wait_seconds();
    exchange_total += exchange_s;
    bytes_total += row.send_bytes;
    const uint64_t step = batch->step();
    const double wait_s = batch->wait_seconds();
    if (absl::Status r = batch->Release(); !r.ok()) {
      std::fprintf(stderr, "tutti-rank-demo rank %u: %s\n", rank, std::string(r.message()).c_str());
    }
    const double step_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
    if (absl::GetFlag(FLAGS_report)) {
      absl::Status r = client->ReportTiming(
          step, {{"data_wait", wait_s}, {"exchange", exchange_s}, {"step", step_s}});
      if (!r.ok())
        std::fprintf(stderr, "tutti-rank-demo rank %u: (continuing) %s\n", rank,
                     std::string(r.message()).c_str());
    }
    MPI_Gather(&row, sizeof(row), MPI_BYTE, rows.data(), sizeof(row), MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      for (const auto& r : rows) std::printf("%s\n", tutti::FormatStepRow(r).c_str());
      std::fflush(stdout);
    }
  }
  double totals[3] = {wait_total, exchange_total, static_cast<double>(bytes_total)}, sums[3];
  MPI_Reduce(totals, sums, 3, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf(
        "%lld steps x %u ranks: mean wait %.2f ms, mean exchange %.2f ms, %.0f bytes "
        "exchanged, every byte verified\n",
        static_cast<long long>(steps), world, steps ? sums[0] * 1e3 / (steps * world) : 0.0,
        steps ? sums[1] * 1e3 / (steps * world) : 0.0, sums[2]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "a training rank without the model: pulls batches, exchanges per plan, checks every byte.\n"
      "Run under mpirun, one process per rank: mpirun -np 4 tutti-rank-demo --stager H:P --packer "
      "H:P");
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "rank_demo.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = tutti::EnsureMpiInitialized(); !s.ok()) {
    std::fprintf(stderr, "tutti-rank-demo: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const int rc = Run();
  // Make the exit code agree across ranks, then leave MPI together.
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}
