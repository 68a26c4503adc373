// tutti-e2e-ranks: the ranks of the end-to-end test, run under mpirun against
// a real tutti-packerd and real tutti-stagerd. Every rank pulls its batch for
// every step through libtutti and checks it against its own plan; rank 0
// gathers what every rank got and checks the step as a whole against the
// packer's plan for all ranks (GetPlan):
//   - the documents (doc_sample_ids) of the 4 ranks are exactly the step's
//     global batch, each once, each rank's in its planned order and length;
//   - every image of every vision-language sample of the batch is encoded
//     exactly once across the ranks, with pixel_values rows = grid_t*grid_h*
//     grid_w and row width 3*temporal_patch*patch^2, grids as planned;
//   - input_ids has the planned number of tokens, cu_seqlens / seq_offsets /
//     micro_batch_offsets agree with the plan, and each document carries one
//     vision_start and llm_tokens image pads per image;
// then the ranks run the plan's forward and backward all-to-all through the
// MPI transport with each item's bytes derived from a checksum of the pixels
// its encoder rank holds, and every receiver checks every byte: it receives
// exactly the images of its own documents, with as many tokens as its
// input_ids hold image pads. With --expect_end, the step after the last is
// refused with OUT_OF_RANGE. Exits 0 and prints "E2E OK ..." (rank 0) when
// everything holds; otherwise every rank exits non-zero and the first problem
// is printed.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/examples/rank_step.h"
#include "client/mpi_transport.h"
#include "common/crc32c.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "tests/e2e_check.h"
#include "tutti/v1/packer.grpc.pb.h"

ABSL_FLAG(std::string, stager, "", "one tutti-stagerd address per node, comma-separated");
ABSL_FLAG(std::string, packer, "", "the tutti-packerd address");
ABSL_FLAG(int64_t, steps, 0, "steps to check (0: every step of the job)");
ABSL_FLAG(bool, expect_end, false, "after the last step, expect OUT_OF_RANGE for the next");
ABSL_FLAG(double, timeout_s, 60, "per batch and per exchange");

namespace tutti::e2e {
namespace {

// True on every rank when `ok` is true on every rank.
bool AllOk(bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// Rank 0's status, on every rank.
absl::Status Broadcast(const absl::Status& root_status) {
  std::string msg(root_status.message());
  int code = static_cast<int>(root_status.code());
  int len = static_cast<int>(msg.size());
  MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
  msg.resize(len);
  MPI_Bcast(msg.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
  return code == 0 ? absl::OkStatus() : absl::Status(static_cast<absl::StatusCode>(code), msg);
}

// Every rank's int64 vector, concatenated in rank order (all ranks get it).
std::vector<std::vector<int64_t>> AllGather(const std::vector<int64_t>& mine, int world) {
  int n = static_cast<int>(mine.size());
  std::vector<int> counts(world), offsets(world);
  MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < world; ++r) offsets[r] = total, total += counts[r];
  std::vector<int64_t> all(total);
  MPI_Allgatherv(mine.data(), n, MPI_INT64_T, all.data(), counts.data(), offsets.data(),
                 MPI_INT64_T, MPI_COMM_WORLD);
  std::vector<std::vector<int64_t>> out(world);
  for (int r = 0; r < world; ++r)
    out[r].assign(all.begin() + offsets[r], all.begin() + offsets[r] + counts[r]);
  return out;
}

absl::StatusOr<v1::StepPlan> FetchPlan(v1::Packer::Stub& packer, const v1::JobInfo& job,
                                       uint64_t step) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::GetPlanRequest req;
  req.set_step(step);
  req.set_world_size(job.config().world_size());
  req.set_config_fingerprint(job.config_fingerprint());
  v1::StepPlan plan;
  RETURN_IF_ERROR(Annotate(FromGrpcStatus(packer.GetPlan(&ctx, req, &plan)),
                           absl::StrCat("GetPlan for step ", step)));
  return plan;
}

struct Totals {
  uint64_t docs = 0, images = 0, patches = 0, tokens = 0, exchanged = 0, cross_rank = 0;
};

absl::Status RunSteps(Client& client, int rank, int world, Totals* totals) {
  const v1::JobInfo& job = client.job();
  const Geometry geo = GeometryOf(job.config());
  std::unique_ptr<v1::Packer::Stub> packer;
  if (rank == 0) packer = v1::Packer::NewStub(MakeChannel(absl::GetFlag(FLAGS_packer)));
  int64_t steps = absl::GetFlag(FLAGS_steps);
  if (steps == 0) steps = static_cast<int64_t>(job.total_steps());
  if (steps <= 0) return absl::InvalidArgumentError("the job has no end; pass --steps");

  for (int64_t s = 0; s < steps; ++s) {
    const uint64_t step = static_cast<uint64_t>(s);
    auto batch = client.Next();
    if (!batch.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, batch.status().ToString().c_str());
    if (!AllOk(batch.ok())) return absl::AbortedError(absl::StrCat("Next() failed at step ", step));

    // 1. This rank's batch against its own plan.
    RankReport report;
    absl::Status local = CheckBatch(*batch, geo, &report);
    if (!local.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, local.ToString().c_str());
    if (!AllOk(local.ok()))
      return absl::AbortedError(absl::StrCat("batch check failed at step ", step));

    // 2. The step as a whole, at rank 0, against the packer's plan.
    const std::vector<std::vector<int64_t>> all = AllGather(report.Encode(), world);
    absl::Status global;
    if (rank == 0) {
      std::vector<RankReport> reports;
      for (const auto& v : all) reports.push_back(RankReport::Decode(v));
      auto plan = FetchPlan(*packer, job, step);
      global = plan.ok() ? CheckStep(*plan, job.config(), reports) : plan.status();
    }
    RETURN_IF_ERROR(Broadcast(global));

    // 3. The exchange, with contents derived from the encoded pixels.
    std::map<ImageKey, ImageFacts> facts;
    for (const auto& v : all) {
      for (const ImageFacts& f : RankReport::Decode(v).images) facts[f.key()] = f;
    }
    absl::Status ex = ExchangeContents(client, *batch, geo, facts);
    if (!ex.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, ex.ToString().c_str());
    if (!AllOk(ex.ok())) return absl::AbortedError(absl::StrCat("exchange failed at step ", step));

    totals->docs += report.docs.size();
    totals->images += report.images.size();
    for (const ImageFacts& f : report.images) totals->patches += f.rows;
    totals->tokens += report.input_ids;
    totals->exchanged += batch->plan().exchange().send_bytes();
    for (const v1::Transfer& t : batch->plan().exchange().sends()) {
      if (t.peer() != static_cast<uint32_t>(rank)) totals->cross_rank += t.bytes();
    }
    absl::Status released = batch->Release();
    if (!released.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, released.ToString().c_str());
    if (!AllOk(released.ok()))
      return absl::AbortedError(absl::StrCat("release failed at step ", step));
  }

  if (absl::GetFlag(FLAGS_expect_end)) {
    auto past = client.Next();
    absl::Status s;
    if (past.ok()) {
      s = absl::InternalError(
          absl::StrCat("step ", steps, " is past the job's end but was served"));
    } else if (!absl::IsOutOfRange(past.status()) ||
               past.status().message().find(absl::StrCat("step ", steps)) ==
                   absl::string_view::npos) {
      s = absl::InternalError(absl::StrCat("step ", steps,
                                           " past the end: expected OUT_OF_RANGE "
                                           "naming the step, got ",
                                           past.status().ToString()));
    } else if (rank == 0) {
      std::printf("past the end: %s\n", past.status().ToString().c_str());
    }
    if (!s.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    if (!AllOk(s.ok())) return absl::AbortedError("the step past the end was not refused");
  }
  return absl::OkStatus();
}

int Main() {
  auto transport =
      MpiTransport::CreateWorld({.join_timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s))});
  if (!transport.ok()) {
    std::fprintf(stderr, "tutti-e2e-ranks: %s\n", transport.status().ToString().c_str());
    return 1;
  }
  const int rank = static_cast<int>((*transport)->rank());
  const int world = static_cast<int>((*transport)->world_size());
  auto stager = StagerForRank(absl::GetFlag(FLAGS_stager), rank, world);
  if (!stager.ok()) {
    std::fprintf(stderr, "tutti-e2e-ranks: %s\n", stager.status().ToString().c_str());
    return 2;
  }
  ClientOptions opts;
  opts.stager_address = *stager;
  opts.packer_address = absl::GetFlag(FLAGS_packer);
  opts.rank = rank;
  opts.world_size = world;
  opts.start_step = 0;
  opts.connect_timeout = absl::Seconds(20);
  opts.batch_timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  auto client = Client::Connect(opts);
  if (!client.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, client.status().ToString().c_str());
  if (!AllOk(client.ok())) return 1;
  (*client)->SetTransport(std::move(*transport));

  Totals t;
  absl::Status s = RunSteps(**client, rank, world, &t);
  if (!s.ok()) {
    if (rank == 0) std::fprintf(stderr, "E2E FAILED: %s\n", s.ToString().c_str());
    return 1;
  }
  uint64_t mine[6] = {t.docs, t.images, t.patches, t.tokens, t.exchanged, t.cross_rank}, sum[6];
  MPI_Reduce(mine, sum, 6, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf(
        "E2E OK steps=%llu docs=%llu images=%llu patches=%llu tokens=%llu "
        "exchanged_bytes=%llu cross_rank_bytes=%llu\n",
        static_cast<unsigned long long>((*client)->next_step()),
        static_cast<unsigned long long>(sum[0]), static_cast<unsigned long long>(sum[1]),
        static_cast<unsigned long long>(sum[2]), static_cast<unsigned long long>(sum[3]),
        static_cast<unsigned long long>(sum[4]), static_cast<unsigned long long>(sum[5]));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace tutti::e2e

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "the ranks of tutti's end-to-end test: mpirun -np 4 tutti-e2e-ranks --stager H:P,H:P "
      "--packer H:P");
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = tutti::EnsureMpiInitialized(); !s.ok()) {
    std::fprintf(stderr, "tutti-e2e-ranks: %s\n", s.ToString().c_str());
    return 1;
  }
  const int rc = tutti::e2e::Main();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}
