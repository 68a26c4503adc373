// The plan's all-to-all over MPI on host memory, with MPI_Alltoallv's
// semantics: every rank posts a receive from and a send to each peer it
// shares bytes with (non-blocking point-to-point, transfers above what an int
// counts go in chunks), copies its own part, and waits with a deadline, so a
// peer that never sends is reported instead of blocking forever. (A sparse
// MPI_Ialltoallv followed by another non-blocking collective hangs in Open
// MPI 4.1's libnbc; point-to-point messages have no such ordering.) Used on
// CPU clusters, in tests, and from Python.
//
// Before data moves, the ranks agree (unless disabled). Fast path: one
// all-reduce of a summary (a hash of every rank's per-peer send and receive
// counts, in which each pair's two sides cancel exactly when they agree;
// exchange number, step, direction and world size; whether any rank refused
// its own input) and one all-reduce that confirms the go-ahead. Only when the
// summary shows a disagreement do the ranks run two point-to-point rounds
// that name the rank and the cause, so a problem anywhere fails the exchange
// on every rank with the same explanation instead of hanging in MPI or
// truncating a message. A rank that never arrives is reported
// (DEADLINE_EXCEEDED naming it, found by a roll call among the ranks that
// gave up) after `join_timeout`, at most twice that in all.
//
// The agreement overlaps the data: a rank whose own input is fine posts its
// sends before the agreement and its receives once the agreement holds, so
// that the agreement's round trips run while the sends are under way and no
// receive buffer is written unless every rank agreed. When the agreement
// fails, every rank learns from the detailed rounds how many messages each
// peer posted to it, receives and drops them, and waits for its own sends:
// nothing of the failed exchange is left to match a later one.
//
// With ExchangeContext.scratch_recv the receives are posted with the sends,
// before the agreement: a large message moves only once its receive is
// posted (rendezvous), so the data then moves during the agreement instead
// of after it. When the agreement fails, each posted receive is cancelled
// (MPI_Cancel); one that a message already matched counts as that peer's
// message received, and the rest are received and dropped as above. After a
// timeout, receives a late peer may still complete are left posted and the
// exchange's memory (ExchangeContext.keepalive) is kept for the process's
// life.
//
// Each peer's bytes move as one message (in chunks of at most max_count
// bytes), straight from the caller's send buffer into its receive buffer;
// the rank's own part is one copy.
#ifndef TUTTI_CLIENT_MPI_TRANSPORT_H_
#define TUTTI_CLIENT_MPI_TRANSPORT_H_

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/transport.h"

namespace tutti {

struct MpiTransportOptions {
  // Agree before moving data (see above). Costs two small all-reduces when
  // the ranks agree. Default true.
  bool verify = true;
  // How long the agreement waits for every rank to arrive. Ranks reach an
  // exchange at different times (the encoder phase of one rank may be much
  // longer than another's), so this is generous. After a timeout the
  // transport refuses further exchanges: a late rank's messages may still be
  // in flight, so the job should stop. Default 600 s.
  absl::Duration join_timeout = absl::Seconds(600);
  // Largest message handed to MPI (its count is an int). Larger transfers go
  // as several messages of at most this many bytes. Default INT_MAX; tests
  // lower it to exercise that path.
  uint64_t max_count = INT_MAX;
};

// Initialises MPI (thread level MPI_THREAD_SERIALIZED) unless it is already
// initialised; MPI is then ended at process exit by FinishMpi(1). Safe to
// call again.
absl::Status EnsureMpiInitialized();

// Ends MPI in this process: MPI_Finalize, or, once an exchange has given up
// on a peer (it may be dead, and finalising would wait for it forever),
// MPI_Abort(MPI_COMM_WORLD, abort_code), which ends the whole job. Does
// nothing when MPI is not initialised or already finalised.
void FinishMpi(int abort_code = 1);

// An MPI error code as a Status: "<what>: <MPI error string>".
absl::Status MpiStatus(int code, absl::string_view what);

class MpiTransport final : public Transport {
 public:
  // Duplicates `comm` (a collective call over comm), so the transport's
  // messages never mix with the application's. MPI must be initialised.
  static absl::StatusOr<std::unique_ptr<MpiTransport>> Create(MPI_Comm comm,
                                                              const MpiTransportOptions& opts = {});
  // EnsureMpiInitialized(), then Create(MPI_COMM_WORLD).
  static absl::StatusOr<std::unique_ptr<MpiTransport>> CreateWorld(
      const MpiTransportOptions& opts = {});

  ~MpiTransport() override;
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  uint32_t rank() const override { return rank_; }
  uint32_t world_size() const override { return size_; }
  absl::string_view name() const override { return "mpi"; }

  absl::Status Agree(const ExchangeLayout& layout, const absl::Status& local) override;

  // Exchanges run so far (agreed or not); they are numbered from 1.
  uint64_t exchanges() const { return seq_; }
  // Exchanges with a transfer above max_count (sent in several messages).
  uint64_t large_exchanges() const { return large_exchanges_; }
  // Data messages this rank posted to its peers in its latest exchange (a
  // chunk of at most max_count bytes each; 0 when it moved nothing), in all
  // and per peer (world_size entries).
  uint64_t messages_sent() const { return messages_; }
  const std::vector<uint64_t>& messages_sent_to() const { return messages_to_; }

 protected:
  // Posts the sends, agrees, then receives (see above).
  absl::Status AgreeAndMove(const ExchangeLayout& layout, const absl::Status& local,
                            const ExchangeData& data) override;
  absl::Status Move(const ExchangeLayout& layout, const void* send, void* recv) override;

 private:
  struct Header;  // the agreement messages
  // A contiguous message to or from one peer.
  struct Piece {
    bool receive;
    uint32_t peer;
    char* data;
    uint64_t count;
  };
  // This rank's own part, copied locally.
  struct LocalCopy {
    char* dst;
    const char* src;
    uint64_t bytes;
  };
  // An exchange's messages (receives, then sends, each rank starting with a
  // different peer) and its own part.
  struct Messages {
    std::vector<Piece> pieces;
    std::vector<LocalCopy> own;
    std::shared_ptr<void> keepalive;  // the caller's memory (ExchangeContext.keepalive)
  };
  // Messages posted before the agreement completed: the sends' requests and
  // how many messages went to each peer; with scratch receives, the
  // receives' requests and each one's peer; the memory to keep if a late
  // peer may still use it.
  struct Early {
    std::vector<MPI_Request> reqs;
    std::vector<uint64_t> to_peer;
    std::vector<MPI_Request> recv_reqs;
    std::vector<uint32_t> recv_peer;
    std::shared_ptr<void> keepalive;
  };
  static void CopyOwn(const Messages& m);
  // One message per peer with bytes, straight between the buffers.
  Messages ContiguousMessages(const ExchangeLayout& layout, const void* send, void* recv) const;
  // Posts the receives (or the sends) of `m` in order, in chunks of at most
  // max_count bytes; counts the messages per peer into `per_peer` and notes
  // each request's peer in `peers`, if set.
  absl::Status Post(const Messages& m, bool receive, std::vector<MPI_Request>* reqs,
                    std::vector<uint64_t>* per_peer, std::vector<uint32_t>* peers = nullptr);
  // Posts what `early` has not posted, copies the own part and waits for
  // every message until join_timeout.
  absl::Status Deliver(const ExchangeLayout& layout, const Messages& m, Early* early);
  // Cancels the early receives of `early`, waiting until `deadline` for each
  // to be cancelled or completed; counts per peer in `consumed` (if set) the
  // ones a message had matched. False if some did not finish (they are left
  // posted and the exchange's memory abandoned).
  static bool CancelReceives(Early* early, absl::Time deadline, std::vector<uint64_t>* consumed);
  MpiTransport(MPI_Comm comm, int rank, int size, const MpiTransportOptions& opts)
      : comm_(comm), rank_(rank), size_(size), opts_(opts) {}

  // The agreement of exchange seq_. `early`: sends already posted, withdrawn
  // (Withdraw) when the agreement fails.
  absl::Status RunAgreement(const ExchangeLayout& layout, const absl::Status& local, Early* early);
  // After a failed agreement: receives and drops every message a peer said
  // (in `hellos`) it posted to this rank, then waits for this rank's early
  // sends; breaks the transport if that does not finish in join_timeout.
  void Withdraw(const std::string& where, const std::vector<Header>& hellos, Early* early);
  // Gives up on early messages that will not complete (a peer gave up or is
  // gone): frees the sends, cancels the receives, keeps their memory.
  static void ReleaseSends(Early* early);
  // Whether a rank announced with a roll call that it gave up waiting.
  bool SomeRankGaveUp();
  int DataTag(uint64_t seq) const;

  // One round: sends out[p] to and receives (*in)[p] from every other rank,
  // waiting until `deadline`. On timeout, *missing lists the ranks whose
  // messages did not arrive and the result is DEADLINE_EXCEEDED.
  absl::Status Round(int tag, const std::vector<Header>& out, std::vector<Header>* in,
                     absl::Time deadline, std::vector<int>* missing);
  // The two point-to-point rounds that find which rank disagrees and why.
  absl::Status AgreeInDetail(const ExchangeLayout& layout, const absl::Status& local,
                             const std::string& where, absl::Time deadline, Early* early);

  MPI_Comm comm_;
  uint32_t rank_;
  uint32_t size_;
  MpiTransportOptions opts_;
  uint64_t seq_ = 0;
  uint64_t large_exchanges_ = 0;
  uint64_t messages_ = 0;              // data messages sent in the latest exchange
  std::vector<uint64_t> messages_to_;  // ... per peer
  absl::Status broken_;                // set after a timeout; every later exchange fails with it

  // Refuses every later exchange, saying that the one at `where` `what`
  // ("timed out", "failed while moving data"); FinishMpi then aborts.
  void Break(const std::string& where, absl::string_view what);
};

}  // namespace tutti

#endif  // TUTTI_CLIENT_MPI_TRANSPORT_H_
