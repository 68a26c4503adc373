// How a plan's all-to-all moves bytes between ranks. A Transport runs on a
// communicator (MPI, NCCL) whose rank numbering is the plan's.
//
// Exchange() and ExchangeBackward() are the entry points: they derive the
// layout from the plan (client/exchange_layout.h), check the caller's buffer
// sizes, let the ranks agree that everyone can run this exchange (Agree), and
// only then move data (Move). A transport may post its sends while the
// agreement runs (AgreeAndMove), and its receives only when the caller says
// the receive memory is scratch (ExchangeContext.scratch_recv): otherwise a
// failed agreement leaves every receive buffer untouched. Every rank of the
// communicator must call them in the same order (they are collective).
//
// Implementations: MpiTransport (client/mpi_transport.h; host memory,
// MPI_Alltoallv semantics over point-to-point messages with a deadline) and,
// when built with NCCL, NcclTransport (client/nccl_transport.h; device
// memory, grouped ncclSend/ncclRecv).
//
// Thread-safety: exchanges on one Transport are serialised by an internal
// mutex; call them from one thread per rank as collectives require.
#ifndef TUTTI_CLIENT_TRANSPORT_H_
#define TUTTI_CLIENT_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "client/exchange_layout.h"
#include "client/proto_fwd.h"

namespace tutti {

// What one exchange moves: the contiguous send and receive buffers.
struct ExchangeData {
  const void* send = nullptr;
  void* recv = nullptr;
  // ExchangeContext.scratch_recv and .keepalive.
  bool scratch_recv = false;
  std::shared_ptr<void> keepalive;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual uint32_t rank() const = 0;
  virtual uint32_t world_size() const = 0;
  virtual absl::string_view name() const = 0;

  // Runs the plan's forward exchange: `send` holds send_bytes laid out as the
  // concatenation of plan.exchange().sends' items, `recv` receives recv_bytes
  // laid out over plan.exchange().recvs (see plan.proto); with
  // ctx.encoder, only that encoder's items: `send` is then that encoder's
  // output as the plan's EncoderPhase lists it. Each peer's bytes move as one
  // message (plan_version 4: a pair is one contiguous run at both ends).
  // Byte counts are checked against the plan before anything moves: a
  // mismatch is INVALID_ARGUMENT naming expected and given sizes. The memory
  // space of the buffers is the transport's (host for MPI, device for NCCL).
  absl::Status Exchange(const v1::RankPlan& plan, const void* send, size_t send_bytes, void* recv,
                        size_t recv_bytes, const ExchangeContext& ctx = {});

  // The inverse exchange (backward pass): sends become receives. `send` has
  // the forward receive layout and `recv` the forward send layout.
  absl::Status ExchangeBackward(const v1::RankPlan& plan, const void* send, size_t send_bytes,
                                void* recv, size_t recv_bytes, const ExchangeContext& ctx = {});

  // The plan's load exchange (RankPlan.load_exchange: inputs whose shard
  // this rank's node does not stage, from a rank whose node does), laid out
  // like the forward exchange; run it before the encoders. Empty when every
  // shard is staged everywhere (every rank must still call it: collective).
  absl::Status ExchangeLoad(const v1::RankPlan& plan, const void* send, size_t send_bytes,
                            void* recv, size_t recv_bytes, const ExchangeContext& ctx = {});

  // Collective agreement before data moves. `local` is this rank's own
  // verdict on its input (OK, or why it refuses); the result is OK on every
  // rank only if every rank is OK and the ranks' byte counts agree pairwise.
  // The base implementation checks nothing across ranks and returns `local`.
  virtual absl::Status Agree(const ExchangeLayout& layout, const absl::Status& local);

 protected:
  // One exchange: the agreement (`local`: this rank's own verdict) and, once
  // every rank agreed, the data. The default runs Agree(), then Move(). An
  // override may post its sends before the agreement completes, and its
  // receives too when data.scratch_recv, provided that when the agreement
  // fails no message of the exchange is left in flight (and, unless
  // data.scratch_recv, no receive buffer is written).
  virtual absl::Status AgreeAndMove(const ExchangeLayout& layout, const absl::Status& local,
                                    const ExchangeData& data);
  // Moves the bytes of an agreed layout (one message per peer). Called only
  // after Agree() succeeded.
  virtual absl::Status Move(const ExchangeLayout& layout, const void* send, void* recv) = 0;

 private:
  absl::Status Run(ExchangeDirection dir, const v1::RankPlan& plan, const void* send,
                   size_t send_bytes, void* recv, size_t recv_bytes, const ExchangeContext& ctx)
      ABSL_LOCKS_EXCLUDED(run_mu_);

  absl::Mutex run_mu_;  // one exchange at a time
};

}  // namespace tutti

#endif  // TUTTI_CLIENT_TRANSPORT_H_
