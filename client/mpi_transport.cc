#include "client/mpi_transport.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/rng.h"
#include "common/status.h"
#include "tutti/v1/plan.pb.h"

namespace tutti {
namespace {

const Logger kLog("client.mpi");

constexpr uint64_t kHelloMagic = 0x5455545449484c4full;     // "TUTTIHLO"
constexpr uint64_t kVerdictMagic = 0x5455545449564454ull;   // "TUTTIVDT"
constexpr uint64_t kRollCallMagic = 0x545554544952434cull;  // "TUTTIRCL"
constexpr int kHelloTag = 7101;
constexpr int kVerdictTag = 7102;
constexpr int kRollCallTag = 7103;
// Data messages carry kDataTagBase + exchange number % kDataTags.
constexpr int kDataTagBase = 8000;
constexpr int kDataTags = 16384;

uint64_t Mix(uint64_t x) { return SplitMix64Of(x); }

// The hash of "rank `from` moves `bytes` to rank `to`, split into items as
// `items` (ExchangeLayout's item hash) says". Sender and receiver both add it
// to the XOR of the summary, so it cancels exactly when they agree on the
// count and on its items.
uint64_t PairHash(uint64_t from, uint64_t to, uint64_t bytes, uint64_t items) {
  return Mix(Mix(Mix((from << 32) | to) ^ bytes) ^ items);
}

// The summary all ranks reduce in the fast agreement: [0] the XOR of every
// pair hash (0 when all pairs agree), then fields and their complements
// reduced by OR, so that OR(x) == ~OR(~x) exactly when every rank has the
// same x.
enum SummaryField : int {
  kPairs = 0,
  kSeq,
  kNotSeq,
  kStep,
  kNotStep,
  kDirection,
  kNotDirection,
  kWorld,
  kNotWorld,
  kEncoder,
  kNotEncoder,
  kRefused,  // OR: some rank refused its own input
  kSummaryFields,
};

void ReduceSummary(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint64_t*>(in);
  auto* b = static_cast<uint64_t*>(inout);
  for (int r = 0; r < *len; ++r, a += kSummaryFields, b += kSummaryFields) {
    b[kPairs] ^= a[kPairs];
    for (int f = kSeq; f < kSummaryFields; ++f) b[f] |= a[f];
  }
}

// The datatype (one summary) and operation of the fast agreement, created once.
struct SummaryOp {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
};
const SummaryOp& GetSummaryOp() {
  static const SummaryOp* op = [] {
    auto* o = new SummaryOp;
    MPI_Type_contiguous(kSummaryFields, MPI_UINT64_T, &o->type);
    MPI_Type_commit(&o->type);
    MPI_Op_create(&ReduceSummary, /*commute=*/1, &o->op);
    return o;
  }();
  return *op;
}

// Keeps the buffers of MPI operations this process gave up on for its whole
// life: a non-blocking collective cannot be cancelled and a freed send may
// still read its buffer, so a late peer completing them must find valid
// memory. A transport gives up at most once (it refuses every exchange
// after), so this stays small.
void Abandon(std::shared_ptr<void> buffers) {
  ABSL_CONST_INIT static absl::Mutex mu(absl::kConstInit);
  static auto* held = new std::vector<std::shared_ptr<void>>;
  absl::MutexLock l(&mu);
  held->push_back(std::move(buffers));
}

// How WaitAll polls. kPolite: a wait for ranks that may not have arrived yet
// (the agreement): yields while waits are short, as ranks may share cores,
// then sleeps in short steps. kBusy: moving data once every rank agreed to
// (all are there): MPI progresses a message only while this process polls
// (the receiver copies large messages fragment by fragment), so a sleep
// between polls stalls the transfer; it yields between polls, as the
// library's own blocking waits do when ranks share cores.
enum class Polling { kPolite, kBusy };

// Waits for `n` requests until `deadline`, polling: a timed MPI wait does
// not exist. DEADLINE_EXCEEDED leaves the requests pending.
absl::Status WaitAll(int n, MPI_Request* reqs, absl::Time deadline, Polling polling) {
  const absl::Time start = absl::Now();
  for (uint64_t spin = 0;; ++spin) {
    int done = 0;
    RETURN_IF_ERROR(MpiStatus(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), "MPI_Testall"));
    if (done) return absl::OkStatus();
    if ((spin & 63) == 0) {
      const absl::Time now = absl::Now();
      if (now > deadline) return absl::DeadlineExceededError("timed out");
      if (polling == Polling::kPolite && now - start > absl::Milliseconds(20)) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        continue;
      }
    }
    std::this_thread::yield();
  }
}

// "every encoder's items", "the vision encoder's items", ...
std::string EncoderName(uint32_t encoder) {
  switch (encoder) {
    case v1::ENCODER_UNSPECIFIED:
      return "every encoder's items";
    case v1::ENCODER_VISION:
      return "the vision encoder's items";
    case v1::ENCODER_AUDIO:
      return "the audio encoder's items";
  }
  return absl::StrCat("encoder ", encoder, "'s items");
}

const char* DirName(uint32_t dir) {
  return ExchangeDirectionName(static_cast<ExchangeDirection>(dir));
}

std::string RankList(const std::vector<int>& ranks) {
  std::vector<int> shown(ranks.begin(), ranks.begin() + std::min<size_t>(ranks.size(), 16));
  std::string s = absl::StrJoin(shown, ", ");
  if (ranks.size() > shown.size())
    absl::StrAppend(&s, " and ", ranks.size() - shown.size(), " more");
  return s;
}

// "step 12, forward exchange #3" (the step left out when unknown): where a
// failed agreement happened, the same text on every rank.
std::string AgreedWhere(uint64_t step, uint32_t dir, uint64_t seq) {
  return absl::StrCat(step == kUnknownStep ? "" : absl::StrCat("step ", step, ", "), DirName(dir),
                      " exchange #", seq);
}

}  // namespace

// What ranks tell each other before an exchange. Plain bytes on the wire:
// every rank runs the same binary on the same architecture.
struct MpiTransport::Header {
  uint64_t magic = 0;
  uint64_t seq = 0;  // the sender's exchange count
  uint64_t step = kUnknownStep;
  uint64_t sends_you = 0;         // hello: bytes the sender sends the receiver
  uint64_t expects_from_you = 0;  // hello: bytes the sender expects from the receiver
  uint64_t messages_to_you = 0;   // hello: data messages the sender already posted to it
  uint64_t items_to_you = 0;      // hello: item hash of what the sender sends the receiver
  uint64_t items_from_you = 0;    // hello: item hash of what it expects from the receiver
  uint32_t direction = 0;
  int32_t code = 0;  // absl::StatusCode of the sender's verdict
  uint32_t world = 0;
  uint32_t sender = 0;
  uint32_t own_input = 0;  // verdict: 1 when it is the sender's refusal of its own input
  uint32_t encoder = 0;    // ExchangeLayout.encoder (0: every item)
  char reason[936] = {};   // the sender's error message, truncated

  void SetStatus(const absl::Status& s) {
    code = static_cast<int32_t>(s.code());
    const size_t n = std::min(s.message().size(), sizeof(reason) - 1);
    if (n > 0) std::memcpy(reason, s.message().data(), n);  // an OK status has no message
    reason[n] = '\0';
  }
};

absl::Status MpiStatus(int code, absl::string_view what) {
  if (code == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return absl::InternalError(
      absl::StrCat(what, ": MPI error ", code, ": ", absl::string_view(text, len)));
}

namespace {
// Set once an exchange of any transport gave up on a peer (timed out or
// failed while moving data): that rank may be dead, and MPI_Finalize would
// wait for it.
std::atomic<bool> peer_lost{false};
}  // namespace

void FinishMpi(int abort_code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  if (peer_lost.load()) {
    kLog.Error(absl::StrCat("an exchange lost a peer rank; aborting the MPI job (code ", abort_code,
                            ") instead of finalising, which would wait for that rank"));
    MPI_Abort(MPI_COMM_WORLD, abort_code);
  }
  MPI_Finalize();
}

absl::Status EnsureMpiInitialized() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return absl::OkStatus();
  MPI_Finalized(&finalized);
  if (finalized) {
    return absl::FailedPreconditionError(
        "MPI was already finalised in this process; it cannot be restarted");
  }
  int provided = 0;
  RETURN_IF_ERROR(MpiStatus(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided),
                            "MPI_Init_thread"));
  std::atexit([] { FinishMpi(1); });
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MpiTransport>> MpiTransport::Create(
    MPI_Comm comm, const MpiTransportOptions& opts) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    return absl::FailedPreconditionError(
        "MPI is not initialised: call MPI_Init first, or use MpiTransport::CreateWorld");
  }
  if (opts.max_count == 0 || opts.max_count > static_cast<uint64_t>(INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MpiTransportOptions.max_count must be in [1, INT_MAX], got ", opts.max_count));
  }
  MPI_Comm dup = MPI_COMM_NULL;
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup"));
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  int rank = 0, size = 0;
  MPI_Comm_rank(dup, &rank);
  MPI_Comm_size(dup, &size);
  return std::unique_ptr<MpiTransport>(new MpiTransport(dup, rank, size, opts));
}

absl::StatusOr<std::unique_ptr<MpiTransport>> MpiTransport::CreateWorld(
    const MpiTransportOptions& opts) {
  RETURN_IF_ERROR(EnsureMpiInitialized());
  return Create(MPI_COMM_WORLD, opts);
}

MpiTransport::~MpiTransport() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

absl::Status MpiTransport::Round(int tag, const std::vector<Header>& out, std::vector<Header>* in,
                                 absl::Time deadline, std::vector<int>* missing) {
  std::vector<MPI_Request> reqs;
  std::vector<int> peer;  // >= 0: receive from that rank; < 0: a send
  reqs.reserve(2 * size_);
  // The headers sent, on the heap: a send still pending at the deadline is
  // freed, and its buffer then abandoned rather than released.
  auto sent = std::make_shared<std::vector<Header>>(out);
  for (uint32_t p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    reqs.emplace_back();
    peer.push_back(static_cast<int>(p));
    RETURN_IF_ERROR(MpiStatus(MPI_Irecv(&(*in)[p], sizeof(Header), MPI_BYTE, static_cast<int>(p),
                                        tag, comm_, &reqs.back()),
                              "MPI_Irecv"));
  }
  for (uint32_t p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    reqs.emplace_back();
    peer.push_back(-1);
    RETURN_IF_ERROR(MpiStatus(MPI_Isend(&(*sent)[p], sizeof(Header), MPI_BYTE, static_cast<int>(p),
                                        tag, comm_, &reqs.back()),
                              "MPI_Isend"));
  }
  std::vector<int> done(reqs.size());
  const absl::Time start = absl::Now();
  for (uint64_t spin = 0;; ++spin) {
    int count = 0;
    RETURN_IF_ERROR(MpiStatus(MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &count,
                                           done.data(), MPI_STATUSES_IGNORE),
                              "MPI_Testsome"));
    if (count == MPI_UNDEFINED) return absl::OkStatus();  // every request completed
    if (count > 0) continue;
    // Poll politely: ranks may share cores while they wait for each other.
    if ((spin & 63) == 0) {
      const absl::Time now = absl::Now();
      if (now > deadline) break;
      if (now - start > absl::Milliseconds(20)) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        continue;
      }
    }
    std::this_thread::yield();
  }
  // Timed out: withdraw what has not arrived.
  bool sends_pending = false;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    if (peer[i] < 0) {
      sends_pending = true;
      MPI_Request_free(&reqs[i]);
      continue;
    }
    MPI_Status st;
    MPI_Cancel(&reqs[i]);
    MPI_Wait(&reqs[i], &st);
    int cancelled = 0;
    MPI_Test_cancelled(&st, &cancelled);
    if (cancelled) missing->push_back(peer[i]);
  }
  if (sends_pending) Abandon(sent);
  if (missing->empty() && !sends_pending) return absl::OkStatus();
  return absl::DeadlineExceededError("timed out");
}

void MpiTransport::Break(const std::string& where, absl::string_view what) {
  peer_lost.store(true);
  broken_ = absl::FailedPreconditionError(
      absl::StrCat("an earlier exchange (", where, ") ", what,
                   "; messages of it may still be in flight, so this transport refuses further "
                   "exchanges: stop the job"));
}

int MpiTransport::DataTag(uint64_t seq) const {
  return kDataTagBase + static_cast<int>(seq % kDataTags);
}

absl::Status MpiTransport::Agree(const ExchangeLayout& layout, const absl::Status& local) {
  if (!broken_.ok()) return broken_;
  ++seq_;
  messages_ = 0;
  messages_to_.assign(size_, 0);
  if (!opts_.verify || size_ == 1) return local;
  return RunAgreement(layout, local, nullptr);
}

absl::Status MpiTransport::AgreeAndMove(const ExchangeLayout& layout, const absl::Status& local,
                                        const ExchangeData& data) {
  if (!broken_.ok()) return broken_;
  ++seq_;
  messages_ = 0;
  messages_to_.assign(size_, 0);
  const bool verify = opts_.verify && size_ > 1;
  // A rank that refuses its own input posts nothing and reads no buffer.
  if (!local.ok()) return verify ? RunAgreement(layout, local, nullptr) : local;
  Messages m = ContiguousMessages(layout, data.send, data.recv);
  m.keepalive = data.keepalive;
  if (!verify) return Deliver(layout, m, nullptr);
  // The sends go first (with scratch receive memory, after the receives);
  // what this rank posted is withdrawn if the ranks disagree (a failure to
  // post is this rank's refusal).
  Early early;
  early.to_peer.assign(size_, 0);
  early.keepalive = m.keepalive;
  absl::Status posted = absl::OkStatus();
  if (data.scratch_recv) {
    posted = Post(m, /*receive=*/true, &early.recv_reqs, nullptr, &early.recv_peer);
  }
  if (posted.ok()) posted = Post(m, /*receive=*/false, &early.reqs, &early.to_peer);
  if (posted.ok() && data.scratch_recv) {
    // The receive memory is scratch: this rank's own items are copied while
    // the agreement's all-reduce is under way instead of after it.
    CopyOwn(m);
    m.own.clear();
  }
  RETURN_IF_ERROR(RunAgreement(layout, posted, &early));
  return Deliver(layout, m, &early);
}

void MpiTransport::ReleaseSends(Early* early) {
  if (early == nullptr) return;
  // A send cannot be cancelled: it is released, and its scratch kept.
  for (MPI_Request& r : early->reqs) {
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
  early->reqs.clear();
  // A receive is cancelled unless a message already matched it; a peer may
  // be gone, so only briefly waited for.
  (void)CancelReceives(early, absl::Now() + absl::Milliseconds(200), nullptr);
  if (early->keepalive) Abandon(early->keepalive);
}

bool MpiTransport::CancelReceives(Early* early, absl::Time deadline,
                                  std::vector<uint64_t>* consumed) {
  if (early == nullptr || early->recv_reqs.empty()) return true;
  for (MPI_Request& r : early->recv_reqs) MPI_Cancel(&r);
  bool all = true;
  for (size_t k = 0; k < early->recv_reqs.size(); ++k) {
    MPI_Request& r = early->recv_reqs[k];
    for (uint64_t spin = 0;; ++spin) {
      int flag = 0;
      MPI_Status st;
      // A receive that a message matched completes (or fails, if the message
      // was larger: it is consumed all the same); an unmatched one is
      // cancelled at once.
      const int rc = MPI_Test(&r, &flag, &st);
      if (flag || rc != MPI_SUCCESS) {
        int cancelled = 0;
        if (rc == MPI_SUCCESS) MPI_Test_cancelled(&st, &cancelled);
        if (!cancelled && consumed != nullptr) ++(*consumed)[early->recv_peer[k]];
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
        break;
      }
      if ((spin & 63) == 0 && absl::Now() > deadline) {
        // Still moving (a peer stopped halfway): left to complete into
        // memory that is kept for the rest of the process.
        MPI_Request_free(&r);
        all = false;
        break;
      }
      std::this_thread::yield();
    }
  }
  early->recv_reqs.clear();
  if (!all && early->keepalive) Abandon(early->keepalive);
  return all;
}

bool MpiTransport::SomeRankGaveUp() {
  int flag = 0;
  MPI_Status st;
  // The roll call of ranks that timed out reaches every rank, also a late one.
  for (int k = 0; k < 4 && !flag; ++k) {
    MPI_Iprobe(MPI_ANY_SOURCE, kRollCallTag, comm_, &flag, &st);
  }
  return flag != 0;
}

void MpiTransport::Withdraw(const std::string& where, const std::vector<Header>& hellos,
                            Early* early) {
  const absl::Time deadline = absl::Now() + opts_.join_timeout;
  // Receives posted early are cancelled first; each one a message matched
  // is one message of that peer received.
  std::vector<uint64_t> consumed(size_, 0);
  bool done = CancelReceives(early, deadline, &consumed);
  std::vector<char> scratch;
  for (uint32_t p = 0; p < size_ && done; ++p) {
    const Header& h = hellos[p];
    if (p == rank_ || h.magic != kHelloMagic || h.sender != p) continue;
    const int tag = DataTag(h.seq);  // the sender's exchange number
    // This rank's receives carried its own exchange number's tag: they can
    // have matched only messages of a sender at the same number.
    const uint64_t received = tag == DataTag(seq_) ? consumed[p] : 0;
    for (uint64_t k = received; k < h.messages_to_you && done;) {
      int flag = 0;
      MPI_Message msg = MPI_MESSAGE_NULL;
      MPI_Status st;
      if (MPI_Improbe(static_cast<int>(p), tag, comm_, &flag, &msg, &st) != MPI_SUCCESS) {
        done = false;
      } else if (flag) {
        int n = 0;
        MPI_Get_count(&st, MPI_BYTE, &n);
        if (scratch.size() < static_cast<size_t>(n)) scratch.resize(n);
        done = MPI_Mrecv(scratch.data(), n, MPI_BYTE, &msg, MPI_STATUS_IGNORE) == MPI_SUCCESS;
        ++k;
      } else if (absl::Now() > deadline) {
        done = false;
      } else {
        std::this_thread::yield();
      }
    }
  }
  if (done && early != nullptr && !early->reqs.empty()) {
    done =
        WaitAll(static_cast<int>(early->reqs.size()), early->reqs.data(), deadline, Polling::kBusy)
            .ok();
    if (done) early->reqs.clear();
  }
  if (!done) {
    ReleaseSends(early);
    Break(where, "could not withdraw its messages after the ranks disagreed");
  }
}

absl::Status MpiTransport::RunAgreement(const ExchangeLayout& layout, const absl::Status& local,
                                        Early* early) {
  static_assert(sizeof(Header) == 1024, "agreement messages are 1 KiB");
  const std::string where =
      absl::StrCat(ExchangeWhere(layout.step, rank_), ", ",
                   DirName(static_cast<uint32_t>(layout.direction)), " exchange #", seq_);
  const absl::Time deadline = absl::Now() + opts_.join_timeout;
  // One all-reduce of a summary. Equal counts between every pair, the same
  // exchange number, step, direction and world everywhere, and no refusal:
  // the exchange may go ahead. A rank whose all-reduce completed only after
  // the others had given up (it arrived too late) then waits in vain for
  // the data, and Move() reports it after join_timeout.
  // On the heap: an all-reduce given up on cannot be cancelled, and a late
  // rank completes it later; its buffers are then abandoned, not released.
  struct Summary {
    uint64_t mine[kSummaryFields] = {}, all[kSummaryFields] = {};
    MPI_Request req = MPI_REQUEST_NULL;
  };
  auto summary = std::make_shared<Summary>();
  uint64_t* mine = summary->mine;
  const uint64_t* all = summary->all;
  for (uint32_t p = 0; p < size_; ++p) {
    mine[kPairs] ^= PairHash(rank_, p, layout.send_counts[p], layout.send_item_hashes[p]) ^
                    PairHash(p, rank_, layout.recv_counts[p], layout.recv_item_hashes[p]);
  }
  const uint64_t fields[][2] = {{kSeq, seq_},
                                {kStep, layout.step},
                                {kDirection, static_cast<uint64_t>(layout.direction)},
                                {kWorld, size_},
                                {kEncoder, static_cast<uint64_t>(layout.encoder)}};
  for (const auto& [f, v] : fields) {
    mine[f] = v;
    mine[f + 1] = ~v;
  }
  mine[kRefused] = local.ok() ? 0 : 1;
  const SummaryOp& op = GetSummaryOp();
  RETURN_IF_ERROR(Annotate(
      MpiStatus(MPI_Iallreduce(mine, summary->all, 1, op.type, op.op, comm_, &summary->req),
                "MPI_Iallreduce"),
      where));
  absl::Status waited = WaitAll(1, &summary->req, deadline, Polling::kPolite);
  if (absl::IsDeadlineExceeded(waited)) {
    Abandon(summary);
    ReleaseSends(early);
    Break(where, "timed out");
    // Who is missing: every rank that gave up answers a roll call.
    std::vector<Header> out(size_), in(size_);
    for (uint32_t p = 0; p < size_; ++p) {
      out[p].magic = kRollCallMagic;
      out[p].seq = seq_;
      out[p].world = size_;
      out[p].sender = rank_;
    }
    std::vector<int> missing;
    (void)Round(kRollCallTag, out, &in, absl::Now() + opts_.join_timeout, &missing);
    return absl::DeadlineExceededError(absl::StrCat(
        where, ": rank(s) ", missing.empty() ? std::string("?") : RankList(missing),
        " did not join the exchange within ", absl::FormatDuration(opts_.join_timeout),
        " (crashed, stuck, or calling Exchange a different number of times); stop the job"));
  }
  if (!waited.ok()) {
    ReleaseSends(early);
    Break(where, "failed");
    return Annotate(waited, where);
  }
  const bool agreed = all[kPairs] == 0 && all[kRefused] == 0 && all[kSeq] == ~all[kNotSeq] &&
                      all[kStep] == ~all[kNotStep] && all[kDirection] == ~all[kNotDirection] &&
                      all[kWorld] == ~all[kNotWorld] && all[kEncoder] == ~all[kNotEncoder];
  if (!agreed) {
    // Something disagrees (every rank sees the same summary and comes here):
    // the detailed rounds say which rank and why.
    absl::Status detail = AgreeInDetail(layout, local, where, deadline, early);
    if (!detail.ok()) return detail;
    // Only unknown steps differed, which the detailed check accepts.
  }
  if (SomeRankGaveUp()) {
    // This rank arrived after another had given up on the exchange: that
    // rank moves no data, and what it posted must not be received.
    ReleaseSends(early);
    Break(where, "timed out");
    return absl::DeadlineExceededError(absl::StrCat(
        where, ": the other ranks did not complete the exchange within ",
        absl::FormatDuration(opts_.join_timeout),
        " (they gave up waiting: this rank arrived too late); the receive buffer is incomplete; "
        "stop the job"));
  }
  return absl::OkStatus();
}

absl::Status MpiTransport::AgreeInDetail(const ExchangeLayout& layout, const absl::Status& local,
                                         const std::string& where, absl::Time deadline,
                                         Early* early) {
  auto timed_out = [&](const std::vector<int>& missing, const char* stage) {
    ReleaseSends(early);
    Break(where, "timed out");
    return absl::DeadlineExceededError(absl::StrCat(
        where, ": rank(s) ", missing.empty() ? std::string("?") : RankList(missing), " did not ",
        stage, " within ", absl::FormatDuration(opts_.join_timeout),
        " (crashed, stuck, or calling Exchange a different number of times); stop the job"));
  };

  // Round 1: what each rank sends to and expects from each other one.
  std::vector<Header> out(size_), in(size_);
  for (uint32_t p = 0; p < size_; ++p) {
    Header& h = out[p];
    h.magic = kHelloMagic;
    h.seq = seq_;
    h.step = layout.step;
    h.sends_you = layout.send_counts[p];
    h.expects_from_you = layout.recv_counts[p];
    h.items_to_you = layout.send_item_hashes[p];
    h.items_from_you = layout.recv_item_hashes[p];
    h.messages_to_you = early != nullptr ? early->to_peer[p] : 0;
    h.direction = static_cast<uint32_t>(layout.direction);
    h.encoder = static_cast<uint32_t>(layout.encoder);
    h.world = size_;
    h.sender = rank_;
    h.SetStatus(local);
  }
  std::vector<int> missing;
  auto failed = [&](const absl::Status& s) {
    ReleaseSends(early);
    Break(where, "failed");
    return Annotate(s, where);
  };
  absl::Status round = Round(kHelloTag, out, &in, deadline, &missing);
  if (absl::IsDeadlineExceeded(round)) return timed_out(missing, "join the exchange");
  if (!round.ok()) return failed(round);
  const std::vector<Header> hellos = in;
  // This rank's verdict: its own refusal, or the first disagreement it sees
  // with a peer, worded with absolute ranks so that any rank can report it.
  absl::Status verdict = local;
  const uint32_t me = rank_;
  for (uint32_t p = 0; p < size_ && verdict.ok(); ++p) {
    if (p == rank_) continue;
    const Header& h = in[p];
    auto refuse = [&](auto&&... parts) {
      verdict = absl::FailedPreconditionError(absl::StrCat(parts...));
    };
    const char* disagree =
        ": the ranks' plans disagree (different steps or jobs, or a corrupt plan)";
    if (h.magic != kHelloMagic || h.sender != p || h.world != size_) {
      refuse("rank ", me, " received a malformed agreement message from rank ", p,
             " (another library using this communicator's tags?)");
    } else if (h.seq != seq_) {
      refuse("rank ", p, " is at exchange #", h.seq, " but rank ", me, " at #", seq_,
             ": the ranks called Exchange a different number of times");
    } else if (h.direction != static_cast<uint32_t>(layout.direction)) {
      refuse("rank ", p, " runs the ", DirName(h.direction), " exchange but rank ", me, " the ",
             DirName(static_cast<uint32_t>(layout.direction)));
    } else if (h.code != 0) {
      continue;  // it refused its own input and says why in round 2
    } else if (local.ok() && h.encoder != static_cast<uint32_t>(layout.encoder)) {
      refuse("rank ", p, " exchanges ", EncoderName(h.encoder), " but rank ", me, " ",
             EncoderName(static_cast<uint32_t>(layout.encoder)));
    } else if (local.ok() && h.step != layout.step && h.step != kUnknownStep &&
               layout.step != kUnknownStep) {
      refuse("rank ", p, " is exchanging step ", h.step, "'s plan but rank ", me, " step ",
             layout.step, "'s (a rank skipped a step?)");
    } else if (local.ok() && h.sends_you != layout.recv_counts[p]) {
      refuse("rank ", p, " sends ", h.sends_you, " bytes to rank ", me, " but rank ", me,
             "'s plan expects ", layout.recv_counts[p], " from it", disagree);
    } else if (local.ok() && h.expects_from_you != layout.send_counts[p]) {
      refuse("rank ", p, " expects ", h.expects_from_you, " bytes from rank ", me, " but rank ", me,
             "'s plan sends it ", layout.send_counts[p], disagree);
    } else if (local.ok() && h.items_to_you != layout.recv_item_hashes[p]) {
      refuse("rank ", p, " splits the ", h.sends_you, " bytes it sends to rank ", me,
             " into other items than rank ", me, "'s plan", disagree);
    } else if (local.ok() && h.items_from_you != layout.send_item_hashes[p]) {
      refuse("rank ", p, " expects the ", h.expects_from_you, " bytes from rank ", me,
             " in other items than rank ", me, "'s plan", disagree);
    }
  }

  // Round 2: every rank's verdict, so that all decide alike.
  for (uint32_t p = 0; p < size_; ++p) {
    out[p].magic = kVerdictMagic;
    out[p].SetStatus(verdict);
    out[p].own_input = local.ok() ? 0 : 1;
  }
  missing.clear();
  round = Round(kVerdictTag, out, &in, deadline, &missing);
  if (absl::IsDeadlineExceeded(round)) return timed_out(missing, "confirm the exchange");
  if (!round.ok()) return failed(round);
  in[rank_] = out[rank_];  // this rank's own verdict beside the others'
  // Every rank reports the lowest rank's verdict, in the words that rank
  // sent (so truncated alike), with that rank's step and exchange number.
  int first = -1;
  std::vector<int> refused_too;
  for (uint32_t p = 0; p < size_; ++p) {
    if (in[p].code == 0) continue;
    if (first < 0) {
      first = static_cast<int>(p);
    } else if (in[p].own_input && in[first].own_input) {
      refused_too.push_back(static_cast<int>(p));
    }
  }
  if (first >= 0) {
    const Header& v = in[first];
    const std::string at = AgreedWhere(v.step, v.direction, v.seq);
    const std::string reason(v.reason, strnlen(v.reason, sizeof(v.reason)));
    verdict = absl::Status(
        static_cast<absl::StatusCode>(v.code),
        v.own_input
            ? absl::StrCat(at, ": rank ", first, " refused the exchange: ", reason,
                           refused_too.empty()
                               ? ""
                               : absl::StrCat(" (rank(s) ", RankList(refused_too), " refused too)"))
            : absl::StrCat(at, ": ", reason));
  }
  // Every rank reaches the same decision; on a refusal, what the peers
  // already sent is received and dropped, and this rank's sends complete.
  if (!verdict.ok()) Withdraw(where, hellos, early);
  return verdict;
}

absl::Status MpiTransport::Move(const ExchangeLayout& layout, const void* send, void* recv) {
  return Deliver(layout, ContiguousMessages(layout, send, recv), nullptr);
}

absl::Status MpiTransport::Post(const Messages& m, bool receive, std::vector<MPI_Request>* reqs,
                                std::vector<uint64_t>* per_peer, std::vector<uint32_t>* peers) {
  const uint64_t chunk = opts_.max_count;
  // Messages of this exchange only: a late rank's data never matches another.
  const int tag = DataTag(seq_);
  // Chunks of at most max_count bytes (an int), in order: messages between
  // two ranks with one tag do not overtake each other.
  for (const Piece& piece : m.pieces) {
    if (piece.receive != receive) continue;
    for (uint64_t done = 0; done < piece.count; done += chunk) {
      const int n = static_cast<int>(std::min(chunk, piece.count - done));
      const int peer = static_cast<int>(piece.peer);
      MPI_Request req = MPI_REQUEST_NULL;
      RETURN_IF_ERROR(
          receive ? MpiStatus(MPI_Irecv(piece.data + done, n, MPI_BYTE, peer, tag, comm_, &req),
                              "MPI_Irecv")
                  : MpiStatus(MPI_Isend(piece.data + done, n, MPI_BYTE, peer, tag, comm_, &req),
                              "MPI_Isend"));
      reqs->push_back(req);
      if (!receive) ++messages_, ++messages_to_[piece.peer];
      if (per_peer != nullptr) ++(*per_peer)[piece.peer];
      if (peers != nullptr) peers->push_back(piece.peer);
    }
  }
  return absl::OkStatus();
}

void MpiTransport::CopyOwn(const Messages& m) {
  for (const LocalCopy& c : m.own) std::memcpy(c.dst, c.src, c.bytes);
}

absl::Status MpiTransport::Deliver(const ExchangeLayout& layout, const Messages& m, Early* early) {
  bool large = false;
  for (const Piece& piece : m.pieces) large |= piece.count > opts_.max_count;
  if (large) ++large_exchanges_;
  std::vector<MPI_Request> reqs;
  absl::Status posted = absl::OkStatus();
  if (early != nullptr && !early->recv_peer.empty()) {
    reqs = std::move(early->recv_reqs);  // posted before the agreement
    early->recv_reqs.clear();
  } else {
    posted = Post(m, /*receive=*/true, &reqs, nullptr);
  }
  const size_t receives = reqs.size();
  if (early != nullptr) {
    reqs.insert(reqs.end(), early->reqs.begin(), early->reqs.end());
    early->reqs.clear();
  } else if (posted.ok()) {
    posted = Post(m, /*receive=*/false, &reqs, nullptr);
  }
  CopyOwn(m);
  absl::Status s = posted.ok() ? WaitAll(static_cast<int>(reqs.size()), reqs.data(),
                                         absl::Now() + opts_.join_timeout, Polling::kBusy)
                               : posted;
  if (s.ok()) return s;
  // Withdraw what is still pending: receives are cancelled, sends released.
  for (size_t k = 0; k < reqs.size(); ++k) {
    if (reqs[k] == MPI_REQUEST_NULL) continue;
    if (k < receives) {
      MPI_Cancel(&reqs[k]);
      MPI_Wait(&reqs[k], MPI_STATUS_IGNORE);
    } else {
      MPI_Request_free(&reqs[k]);
    }
  }
  if (m.keepalive) Abandon(m.keepalive);
  const std::string where =
      absl::StrCat(ExchangeWhere(layout.step, rank_), ", ",
                   DirName(static_cast<uint32_t>(layout.direction)), " exchange #", seq_);
  Break(where,
        absl::IsDeadlineExceeded(s) ? "timed out while moving data" : "failed while moving data");
  if (absl::IsDeadlineExceeded(s)) {
    return absl::DeadlineExceededError(absl::StrCat(
        where, ": the other ranks did not complete the exchange within ",
        absl::FormatDuration(opts_.join_timeout),
        " (they gave up waiting: this rank arrived too late, or a rank crashed); the receive "
        "buffer is incomplete; stop the job"));
  }
  return Annotate(s, absl::StrCat(where, ": the receive buffer is incomplete"));
}

}  // namespace tutti
