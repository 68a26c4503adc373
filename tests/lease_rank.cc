// A training rank without a model, for tests that kill ranks: takes the
// rank's batches for steps [--start_step, --end_step) through libtutti,
// releasing each before the next, and prints one line per step
// ("rank R step S ok"). At --hold_step it prints "rank R holding step S" and
// holds that batch until killed. At --slow_step it holds the batch for
// --slow_seconds (a slow but live rank) and then checks that the stager
// still holds it: its shared-memory segment still exists (a batch the
// stager frees is unlinked) and its bytes are unchanged. With
// --hold_previous it keeps each batch until it has the next (as a trainer
// that assigns Next()'s batch over the previous one does). Prints "rank R
// connected" once connected. Ends with "rank R done" and exit 0; 1 with the
// error otherwise.
#include <cstdio>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/crc32c.h"
#include "common/shm.h"
#include "tutti/v1/stager.pb.h"

ABSL_FLAG(std::string, stager, "", "this node's tutti-stagerd");
ABSL_FLAG(std::string, packer, "", "the job's tutti-packerd");
ABSL_FLAG(int, rank, 0, "rank");
ABSL_FLAG(int64_t, start_step, 0, "first step");
ABSL_FLAG(int64_t, end_step, 8, "step to stop before");
ABSL_FLAG(int64_t, hold_step, -1, "step whose batch is held until the process is killed");
ABSL_FLAG(int64_t, slow_step, -1, "step whose batch is held for --slow_seconds");
ABSL_FLAG(double, slow_seconds, 0, "how long --slow_step's batch is held");
ABSL_FLAG(double, batch_timeout_s, 240, "how long one Next() may wait");
ABSL_FLAG(bool, hold_previous, false, "keep each batch until the next one is in hand");

namespace {

int Fail(int rank, const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "rank %d %s: %s\n", rank, what.c_str(), std::string(s.message()).c_str());
  return 1;
}

uint32_t Crc(const tutti::Batch& batch) {
  const tutti::v1::BatchDescriptor& d = batch.descriptor();
  return tutti::Crc32c(
      absl::string_view(batch.segment()->data(), static_cast<size_t>(d.shm_size())));
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int rank = absl::GetFlag(FLAGS_rank);
  tutti::ClientOptions o;
  o.stager_address = absl::GetFlag(FLAGS_stager);
  o.packer_address = absl::GetFlag(FLAGS_packer);
  o.rank = rank;
  o.start_step = absl::GetFlag(FLAGS_start_step);
  o.connect_timeout = absl::Seconds(60);
  o.batch_timeout = absl::Seconds(absl::GetFlag(FLAGS_batch_timeout_s));
  auto client = tutti::Client::Connect(o);
  if (!client.ok()) return Fail(rank, "connect", client.status());
  std::printf("rank %d connected\n", rank);
  std::fflush(stdout);
  std::optional<tutti::Batch> previous;
  for (int64_t step = o.start_step; step < absl::GetFlag(FLAGS_end_step); ++step) {
    absl::StatusOr<tutti::Batch> batch = (*client)->Next();
    if (!batch.ok()) return Fail(rank, "next", batch.status());
    if (step == absl::GetFlag(FLAGS_hold_step)) {
      std::printf("rank %d holding step %lld\n", rank, static_cast<long long>(step));
      std::fflush(stdout);
      for (;;) absl::SleepFor(absl::Hours(1));
    }
    if (step == absl::GetFlag(FLAGS_slow_step)) {
      const uint32_t before = Crc(*batch);
      absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_slow_seconds)));
      auto still = tutti::ShmSegment::Open(batch->descriptor().shm_name(), false);
      if (!still.ok()) {
        return Fail(rank, "after holding its batch",
                    absl::DataLossError(absl::StrCat("the stager freed step ", step, ": ",
                                                     still.status().message())));
      }
      if (Crc(*batch) != before) {
        return Fail(rank, "after holding its batch",
                    absl::DataLossError(absl::StrCat("step ", step, "'s bytes changed")));
      }
      std::printf("rank %d held step %lld for %.0f s: still held, bytes unchanged\n", rank,
                  static_cast<long long>(step), absl::GetFlag(FLAGS_slow_seconds));
    }
    if (previous) {
      if (absl::Status s = previous->Release(); !s.ok()) return Fail(rank, "release", s);
      previous.reset();
    }
    if (absl::GetFlag(FLAGS_hold_previous)) {
      previous = *std::move(batch);
    } else if (absl::Status s = batch->Release(); !s.ok()) {
      return Fail(rank, "release", s);
    }
    std::printf("rank %d step %lld ok\n", rank, static_cast<long long>(step));
    std::fflush(stdout);
  }
  if (previous) {
    if (absl::Status s = previous->Release(); !s.ok()) return Fail(rank, "release", s);
  }
  std::printf("rank %d done\n", rank);
  return 0;
}
