// One step of `tutti-rank-demo`, kept apart from its main() so it can be
// tested: summarising a batch into a table row, and running the plan's
// forward and backward exchange with buffers whose every byte is checked.
#ifndef TUTTI_CLIENT_EXAMPLES_RANK_STEP_H_
#define TUTTI_CLIENT_EXAMPLES_RANK_STEP_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/batch.h"
#include "client/transport.h"

namespace tutti {

// A row of the per-step table. Plain numbers, so ranks can gather rows as bytes.
struct StepRow {
  uint64_t step = 0;
  uint32_t rank = 0;
  uint32_t skipped = 0;     // samples the stager skipped or substituted
  double wait_ms = 0;       // Next() wait
  uint64_t images = 0;      // images this rank encodes
  uint64_t patches = 0;     // ViT patches (rows of pixel_values)
  uint64_t tokens = 0;      // LLM tokens (input_ids)
  uint64_t sequences = 0;   // packed sequences
  uint64_t send_bytes = 0;  // forward exchange
  uint64_t recv_bytes = 0;
  double exchange_ms = 0;  // forward + backward, verification excluded
};

// The stager address of `rank` from `list`, comma-separated, one address per
// node: ranks fill nodes in contiguous blocks of world / nodes, as the
// packer's ranks_per_node assumes. An empty list gives "" (the client then
// reads TUTTI_STAGER). INVALID_ARGUMENT when world is not a multiple of the
// number of addresses.
absl::StatusOr<std::string> StagerForRank(absl::string_view list, uint32_t rank, uint32_t world);

// Fills every field it can from the batch (not exchange_ms).
StepRow SummarizeBatch(const Batch& batch);

std::string StepTableHeader();
std::string FormatStepRow(const StepRow& row);

// Runs the plan's forward exchange with send buffers filled by the pattern
// of client/exchange_pattern.h, verifies every received byte, then the same
// backward. *seconds receives the time spent in the two exchanges. DATA_LOSS
// names the first wrong byte.
absl::Status ExchangeAndVerify(Transport& transport, const v1::RankPlan& plan,
                               const ExchangeContext& ctx, double* seconds);

}  // namespace tutti

#endif  // TUTTI_CLIENT_EXAMPLES_RANK_STEP_H_
