#include "services/packer/core/packing.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_config.h"

namespace tutti::packer {

absl::StatusOr<std::unique_ptr<PackingStrategy>> MakeStrategy(const StrategyOptions& o) {
  if (o.name == "greedy") return MakeSeedStrategy("greedy", 1, false);
  if (o.name == "seed-v1" || o.name == "seed-v2") {
    if (o.open_bins == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("packing.open_bins is 0 for ", o.name, "; use at least 1 (default 6)"));
    }
    return MakeSeedStrategy(o.name, o.open_bins, o.name == "seed-v2");
  }
  if (o.name == "tutti") return MakeTuttiStrategy(o.improvement_rounds);
  if (auto peer = MakePeerStrategy(o.name)) return peer;
  return absl::InvalidArgumentError(
      absl::StrCat("packing.strategy '", o.name,
                   "' is unknown; choose one of: ", absl::StrJoin(PackingStrategyNames(), ", ")));
}

namespace {
constexpr absl::string_view kCapacityPayload = "tutti.packer/capacity";
}  // namespace

absl::Status AsCapacityError(absl::Status status) {
  if (!status.ok()) status.SetPayload(kCapacityPayload, absl::Cord("1"));
  return status;
}

bool IsCapacityError(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kCapacityPayload).has_value();
}

absl::Status CapacityError(absl::string_view modality, uint64_t tokens, uint32_t ranks,
                           uint32_t seqs_per_rank, uint32_t seq_len, absl::string_view detail) {
  const uint64_t capacity = uint64_t{ranks} * seqs_per_rank * seq_len;
  return AsCapacityError(absl::FailedPreconditionError(absl::StrCat(
      "the ", modality, " samples of this step (", tokens, " tokens) do not fit the world's ",
      modality, " sequences (", ranks, " ranks x ", seqs_per_rank, " sequences x ", seq_len,
      " tokens = ", capacity, ", fill ",
      absl::StrFormat("%.3f", capacity ? double(tokens) / capacity : 0.0), ")",
      detail.empty() ? "" : ": ", detail, "; lower batch.", modality == "text" ? "text" : "vl",
      "_samples_per_step, raise seq_len, or give ", modality, " more micro-batches")));
}

}  // namespace tutti::packer
