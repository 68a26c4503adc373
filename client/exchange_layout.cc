#include "client/exchange_layout.h"

#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/status.h"
#include "tutti/v1/plan.pb.h"

namespace tutti {
namespace {

constexpr uint64_t kEncoderSalt = 0x656e636fULL << 32;  // "enco"

bool Selected(const v1::TransferItem& item, v1::Encoder encoder) {
  return encoder == v1::ENCODER_UNSPECIFIED || item.encoder() == encoder;
}

// How a transfer's bytes (of `encoder`'s items) split into items
// (ExchangeLayout::send_item_hashes).
uint64_t ItemSizesHash(const v1::Transfer& transfer, v1::Encoder encoder) {
  uint64_t h = 0;
  auto add = [&h](uint64_t bytes) {
    if (bytes > 0) h = SplitMix64Of(h ^ SplitMix64Of(bytes));
  };
  if (transfer.items_size() == 0 && encoder == v1::ENCODER_UNSPECIFIED) add(transfer.bytes());
  for (const v1::TransferItem& item : transfer.items()) {
    if (Selected(item, encoder)) add(item.bytes());
  }
  if (h != 0 && encoder != v1::ENCODER_UNSPECIFIED) {
    h = SplitMix64Of(h ^ kEncoderSalt ^ static_cast<uint64_t>(encoder));
  }
  return h;
}

// Fills counts/offsets from one list of transfers (sends or recvs), of
// `encoder`'s items only unless it is ENCODER_UNSPECIFIED.
absl::Status Lay(const google::protobuf::RepeatedPtrField<v1::Transfer>& transfers,
                 const char* what, uint64_t declared_total, v1::Encoder encoder, uint32_t comm_size,
                 const std::string& where, std::vector<uint64_t>* counts,
                 std::vector<uint64_t>* offsets, std::vector<uint64_t>* item_hashes,
                 uint64_t* total) {
  counts->assign(comm_size, 0);
  offsets->assign(comm_size, 0);
  item_hashes->assign(comm_size, 0);
  uint64_t off = 0, all = 0;
  int64_t prev_peer = -1;
  for (const v1::Transfer& t : transfers) {
    if (t.peer() >= comm_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the plan's exchange ", what, " names peer rank ", t.peer(),
                       " but the communicator has ", comm_size,
                       " ranks; the plan was made for a larger job (check world_size)"));
    }
    if (static_cast<int64_t>(t.peer()) <= prev_peer) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the plan's exchange ", what, " lists peer ", t.peer(), " after peer ",
          prev_peer, "; transfers must be ordered by peer with one per peer (a corrupt plan)"));
    }
    prev_peer = t.peer();
    uint64_t bytes = encoder == v1::ENCODER_UNSPECIFIED ? t.bytes() : 0;
    if (t.items_size() > 0) {
      uint64_t items = 0;
      for (const v1::TransferItem& item : t.items()) {
        if (item.bytes() > std::numeric_limits<uint64_t>::max() - items) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": item sizes overflow"));
        }
        items += item.bytes();
        if (encoder != v1::ENCODER_UNSPECIFIED && item.encoder() == encoder) bytes += item.bytes();
      }
      if (items != t.bytes()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": the plan's exchange ", what, " to/from peer ", t.peer(), " declares ",
            t.bytes(), " bytes but its items add up to ", items, " (a corrupt plan)"));
      }
    }
    if (t.bytes() > std::numeric_limits<uint64_t>::max() - all) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": transfer sizes overflow"));
    }
    all += t.bytes();
    (*counts)[t.peer()] = bytes;
    (*offsets)[t.peer()] = off;
    (*item_hashes)[t.peer()] = ItemSizesHash(t, encoder);
    off += bytes;
  }
  if (all != declared_total) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the plan's exchange declares ", declared_total, " ", what,
                     " bytes but its ", what, " transfers add up to ", all, " (a corrupt plan)"));
  }
  *total = off;
  return absl::OkStatus();
}

// Restricted to one encoder, the encoding side's items of that encoder, in
// the order of its sends, must be its EncoderPhase's: the encoder's output
// is then the send buffer as it stands.
absl::Status CheckEncoderOrder(const v1::RankPlan& plan, v1::Encoder encoder,
                               const std::string& where) {
  std::vector<std::pair<uint64_t, uint32_t>> rows;  // (sample, index) in EncoderPhase order
  for (const v1::EncoderPhase& phase : plan.encoders()) {
    if (phase.encoder() != encoder) continue;
    for (const v1::ImagePlan& ip : phase.images())
      rows.emplace_back(ip.sample_id(), ip.image_index());
    for (const v1::AudioPlan& ap : phase.audio())
      rows.emplace_back(ap.sample_id(), ap.audio_index());
  }
  size_t k = 0;
  for (const v1::Transfer& t : plan.exchange().sends()) {
    for (const v1::TransferItem& item : t.items()) {
      if (item.encoder() != encoder) continue;
      if (k >= rows.size() || rows[k] != std::make_pair(item.sample_id(), item.index())) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": the plan sends item (sample ", item.sample_id(), ", index ", item.index(),
            ") to rank ", t.peer(), " as row ", k,
            " of the encoder's output, but its encoder "
            "phase lists ",
            k < rows.size()
                ? absl::StrCat("(sample ", rows[k].first, ", index ", rows[k].second, ")")
                : std::string("fewer items"),
            " there: the encoder output is not grouped by destination (a corrupt plan)"));
      }
      ++k;
    }
  }
  if (k != rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the plan's encoder phase lists ",
                                                   rows.size(), " items but its sends ", k,
                                                   " (a corrupt plan)"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* ExchangeDirectionName(ExchangeDirection dir) {
  switch (dir) {
    case ExchangeDirection::kForward:
      return "forward";
    case ExchangeDirection::kBackward:
      return "backward";
    case ExchangeDirection::kLoad:
      return "load";
  }
  return "?";
}

std::string ExchangeWhere(uint64_t step, uint32_t rank) {
  return step == kUnknownStep ? absl::StrCat("rank ", rank)
                              : absl::StrCat("step ", step, ", rank ", rank);
}

ExchangeLayout EmptyLayout(ExchangeDirection dir, uint32_t comm_rank, uint32_t comm_size,
                           uint64_t step) {
  ExchangeLayout l;
  l.direction = dir;
  l.rank = comm_rank;
  l.world_size = comm_size;
  l.step = step;
  l.send_counts.assign(comm_size, 0);
  l.send_offsets.assign(comm_size, 0);
  l.recv_counts.assign(comm_size, 0);
  l.recv_offsets.assign(comm_size, 0);
  l.send_item_hashes.assign(comm_size, 0);
  l.recv_item_hashes.assign(comm_size, 0);
  return l;
}

absl::StatusOr<ExchangeLayout> BuildExchangeLayout(const v1::RankPlan& plan, ExchangeDirection dir,
                                                   uint32_t comm_rank, uint32_t comm_size,
                                                   const ExchangeContext& ctx) {
  const std::string where = absl::StrCat(ExchangeWhere(ctx.step, comm_rank), ", ",
                                         ExchangeDirectionName(dir), " exchange");
  if (ctx.world_size != 0 && ctx.world_size != comm_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": the plan is for ", ctx.world_size, " ranks but the communicator has ", comm_size,
        "; launch ", ctx.world_size, " ranks (e.g. mpirun -np ", ctx.world_size,
        ") or restart the packer with world_size: ", comm_size));
  }
  if (comm_rank >= comm_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": rank ", comm_rank, " is outside a communicator of ", comm_size, " ranks"));
  }
  if (plan.rank() != comm_rank) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": this process is rank ", comm_rank, " of the communicator but was given rank ",
        plan.rank(), "'s plan; give the client the communicator's rank (TUTTI_RANK)"));
  }
  if (plan.plan_version() < kMinExchangePlanVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": the plan is plan_version ", plan.plan_version(),
        " but this client's exchange needs plan_version ", kMinExchangePlanVersion,
        " or later (every pair one contiguous run at both ends); run a tutti-packerd as new as "
        "the client"));
  }
  const v1::Encoder encoder = ctx.encoder;
  if (encoder != v1::ENCODER_UNSPECIFIED && dir != ExchangeDirection::kLoad) {
    RETURN_IF_ERROR(CheckEncoderOrder(plan, encoder, where));
  }
  ExchangeLayout l = EmptyLayout(dir, comm_rank, comm_size, ctx.step);
  l.encoder = encoder;
  const v1::Exchange& ex = dir == ExchangeDirection::kLoad ? plan.load_exchange() : plan.exchange();
  const bool fwd = dir != ExchangeDirection::kBackward;
  RETURN_IF_ERROR(Lay(fwd ? ex.sends() : ex.recvs(), fwd ? "send" : "receive",
                      fwd ? ex.send_bytes() : ex.recv_bytes(), encoder, comm_size, where,
                      &l.send_counts, &l.send_offsets, &l.send_item_hashes, &l.send_bytes));
  RETURN_IF_ERROR(Lay(fwd ? ex.recvs() : ex.sends(), fwd ? "receive" : "send",
                      fwd ? ex.recv_bytes() : ex.send_bytes(), encoder, comm_size, where,
                      &l.recv_counts, &l.recv_offsets, &l.recv_item_hashes, &l.recv_bytes));
  if (l.send_counts[comm_rank] != l.recv_counts[comm_rank]) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the plan sends ", l.send_counts[comm_rank],
                     " bytes to this rank itself but receives ", l.recv_counts[comm_rank],
                     " from itself (a corrupt plan)"));
  }
  return l;
}

absl::Status CheckBufferSizes(const ExchangeLayout& layout, size_t send_bytes, size_t recv_bytes) {
  const char* dir = ExchangeDirectionName(layout.direction);
  for (const auto& [what, given, expected] :
       {std::tuple<const char*, uint64_t, uint64_t>{"send", send_bytes, layout.send_bytes},
        {"receive", recv_bytes, layout.recv_bytes}}) {
    if (given != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          ExchangeWhere(layout.step, layout.rank), ", ", dir, " exchange: ", what,
          " buffer size mismatch: expected ", expected, " bytes (from the plan), given ", given,
          "; size the buffer from the plan's exchange"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tutti
