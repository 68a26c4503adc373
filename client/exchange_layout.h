// The byte layout of one rank's all-to-all, derived from its plan
// (tutti.v1.Exchange in plan.proto) and checked before anything moves.
//
// Forward: the send buffer is the concatenation, over `sends` in order, of
// each transfer's items; the receive buffer likewise over `recvs`. Backward
// (gradients flowing back to the encoders) is the inverse: sends become
// receives with the same byte counts, so the backward send buffer has the
// forward receive buffer's layout and vice versa. Load: the plan's
// load_exchange (post-balancing's remote inputs, before the encoders run),
// laid out like the forward exchange.
//
// From plan_version 4 on (plan.proto Exchange) every pair is one contiguous
// run at both ends, so each peer's bytes move as one message. Restricted to
// one encoder (ExchangeContext.encoder), the layout takes that encoder's
// items only: its send buffer is then that encoder's output rows as they
// stand (EncoderPhase order, grouped by destination), checked here, and its
// receive buffer holds them grouped by source. Older plans are refused.
#ifndef TUTTI_CLIENT_EXCHANGE_LAYOUT_H_
#define TUTTI_CLIENT_EXCHANGE_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/proto_fwd.h"

namespace tutti {

inline constexpr uint64_t kUnknownStep = ~uint64_t{0};

// The oldest RankPlan.plan_version whose exchange layout this client reads:
// every pair one contiguous run at both ends (plan.proto Exchange).
inline constexpr uint32_t kMinExchangePlanVersion = 4;

enum class ExchangeDirection { kForward = 0, kBackward = 1, kLoad = 2 };

// "forward", "backward" or "load".
const char* ExchangeDirectionName(ExchangeDirection dir);

// What the caller knows about the plan besides the RankPlan itself.
struct ExchangeContext {
  uint64_t step = kUnknownStep;  // named in errors and compared across ranks when known
  uint32_t world_size = 0;       // ranks the plan was made for (StepPlan.world_size); 0 = unknown
  // The caller's own refusal (e.g. "the batch was released"): when not OK
  // the rank still takes part in the agreement, refusing, so that every rank
  // fails the exchange with this reason instead of waiting for it.
  absl::Status refusal;
  // The receive memory is scratch (default false): the caller reads it only
  // when the exchange succeeds. The transport may then post its receives
  // before the ranks have agreed (MPI: a large message moves only once its
  // receive is posted, so the data no longer waits for the agreement's round
  // trips). A failed exchange still fails on every rank alike and leaves no
  // message of it in flight, but may have written into the receive buffers.
  // Transports that cannot post early (NCCL) ignore it. Off: a failed
  // exchange writes no receive buffer.
  bool scratch_recv = false;
  // Owns the exchange's send and receive memory, if set: after a timeout a
  // late peer could still read or write it, and the transport then keeps
  // this reference for the rest of the process. Memory it does not cover
  // must then outlive the process's use of MPI (FinishMpi aborts the job).
  std::shared_ptr<void> keepalive;
  // Only this encoder's items (v1::Encoder: ENCODER_VISION, ENCODER_AUDIO)
  // of the forward and backward exchanges; default ENCODER_UNSPECIFIED:
  // every item. With an encoder, the forward send buffer (the backward
  // receive buffer) is that encoder's output, laid out as its EncoderPhase
  // lists its items, and a pair's bytes are its items of that encoder.
  v1::Encoder encoder = static_cast<v1::Encoder>(0);
};

struct ExchangeLayout {
  ExchangeDirection direction = ExchangeDirection::kForward;
  uint32_t rank = 0;        // this process's rank in the communicator
  uint32_t world_size = 0;  // the communicator's size
  uint64_t step = kUnknownStep;
  // Indexed by peer rank, world_size entries each. Offsets are into this
  // rank's send / receive buffer; a peer without a transfer has count 0.
  std::vector<uint64_t> send_counts, send_offsets;
  std::vector<uint64_t> recv_counts, recv_offsets;
  // Per peer, a hash of how the pair's bytes split into items (the sizes of
  // its non-empty items in order; a transfer without items is one item of
  // its bytes; 0 when nothing moves) and of the encoder they belong to when
  // the layout is restricted to one. Both ends of a pair compute it from
  // their own plan, so a transport's agreement can compare the splits too.
  std::vector<uint64_t> send_item_hashes, recv_item_hashes;
  v1::Encoder encoder = static_cast<v1::Encoder>(0);  // ExchangeContext.encoder
  uint64_t send_bytes = 0;
  uint64_t recv_bytes = 0;
};

// "step 12, rank 3" (or "rank 3" when the step is unknown): the context every
// exchange error starts with.
std::string ExchangeWhere(uint64_t step, uint32_t rank);

// An all-zero layout for (comm_rank, comm_size): what a rank that refused its
// input still takes part in cross-rank checks with.
ExchangeLayout EmptyLayout(ExchangeDirection dir, uint32_t comm_rank, uint32_t comm_size,
                           uint64_t step);

// Builds the layout of `plan` for this process, rank `comm_rank` of a
// communicator of `comm_size` ranks. FAILED_PRECONDITION when the plan is
// older than kMinExchangePlanVersion (naming both versions), was made for
// another world size or belongs to another rank; INVALID_ARGUMENT when the
// plan is inconsistent (a peer out of range, peers out of order or
// repeated, a transfer whose items do not add up to its bytes, totals that
// do not match, a rank sending itself a different count than it receives,
// or, restricted to one encoder, sends that are not that encoder's output
// in order).
absl::StatusOr<ExchangeLayout> BuildExchangeLayout(const v1::RankPlan& plan, ExchangeDirection dir,
                                                   uint32_t comm_rank, uint32_t comm_size,
                                                   const ExchangeContext& ctx = {});

// INVALID_ARGUMENT naming expected and given byte counts when the caller's
// buffers do not match the layout.
absl::Status CheckBufferSizes(const ExchangeLayout& layout, size_t send_bytes, size_t recv_bytes);

}  // namespace tutti

#endif  // TUTTI_CLIENT_EXCHANGE_LAYOUT_H_
