#include "client/examples/rank_step.h"

#include <chrono>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/exchange_pattern.h"
#include "common/status.h"

namespace tutti {

absl::StatusOr<std::string> StagerForRank(absl::string_view list, uint32_t rank, uint32_t world) {
  std::vector<std::string> stagers;
  for (absl::string_view s : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    stagers.emplace_back(absl::StripAsciiWhitespace(s));
  }
  if (stagers.empty()) return std::string();
  if (world == 0 || world % stagers.size() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stager lists ", stagers.size(), " stagers (one per node) but the job has ",
                     world, " ranks, not a multiple of it; give one address per node"));
  }
  return stagers[rank / (world / stagers.size())];
}

StepRow SummarizeBatch(const Batch& batch) {
  StepRow row;
  row.step = batch.step();
  row.rank = batch.rank();
  row.skipped = static_cast<uint32_t>(batch.skipped().size());
  row.wait_ms = batch.wait_seconds() * 1e3;
  row.images = batch.images();
  row.patches = batch.patches();
  row.tokens = batch.input_ids().size();
  const auto seqs = batch.seq_offsets();
  row.sequences = seqs.empty() ? 0 : seqs.size() - 1;
  row.send_bytes = batch.plan().exchange().send_bytes();
  row.recv_bytes = batch.plan().exchange().recv_bytes();
  return row;
}

std::string StepTableHeader() {
  return absl::StrFormat("%6s %5s %9s %7s %9s %9s %5s %8s %10s %10s %8s", "step", "rank", "wait_ms",
                         "images", "patches", "tokens", "seqs", "skipped", "send_KiB", "recv_KiB",
                         "xchg_ms");
}

std::string FormatStepRow(const StepRow& r) {
  return absl::StrFormat("%6d %5d %9.2f %7d %9d %9d %5d %8d %10.1f %10.1f %8.2f", r.step, r.rank,
                         r.wait_ms, r.images, r.patches, r.tokens, r.sequences, r.skipped,
                         r.send_bytes / 1024.0, r.recv_bytes / 1024.0, r.exchange_ms);
}

absl::Status ExchangeAndVerify(Transport& transport, const v1::RankPlan& plan,
                               const ExchangeContext& ctx, double* seconds) {
  const v1::Exchange& ex = plan.exchange();
  const std::string where = ExchangeWhere(ctx.step, plan.rank());
  std::vector<uint8_t> fwd_send(ex.send_bytes()), fwd_recv(ex.recv_bytes());
  RETURN_IF_ERROR(FillPattern(ex.sends(), kForwardSalt, fwd_send.data(), fwd_send.size()));
  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(transport.Exchange(plan, fwd_send.data(), fwd_send.size(), fwd_recv.data(),
                                     fwd_recv.size(), ctx));
  const auto t1 = std::chrono::steady_clock::now();
  // A wrong byte is reported after the backward exchange, which every rank
  // runs whatever it found, so that no rank is left waiting for another.
  absl::Status forward =
      Annotate(VerifyPattern(ex.recvs(), kForwardSalt, fwd_recv.data(), fwd_recv.size()),
               where + ", forward exchange");

  // Backward: gradients of what was received go back to where it came from.
  std::vector<uint8_t> bwd_send(ex.recv_bytes()), bwd_recv(ex.send_bytes());
  RETURN_IF_ERROR(FillPattern(ex.recvs(), kBackwardSalt, bwd_send.data(), bwd_send.size()));
  const auto t2 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(transport.ExchangeBackward(plan, bwd_send.data(), bwd_send.size(),
                                             bwd_recv.data(), bwd_recv.size(), ctx));
  const auto t3 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(forward);
  RETURN_IF_ERROR(
      Annotate(VerifyPattern(ex.sends(), kBackwardSalt, bwd_recv.data(), bwd_recv.size()),
               where + ", backward exchange"));
  if (seconds != nullptr) {
    *seconds = std::chrono::duration<double>((t1 - t0) + (t3 - t2)).count();
  }
  return absl::OkStatus();
}

}  // namespace tutti
