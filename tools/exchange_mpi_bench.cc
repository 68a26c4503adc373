#include "tools/exchange_mpi_bench.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/exchange_layout.h"
#include "client/exchange_pattern.h"
#include "client/mpi_transport.h"
#include "common/status.h"
#include "services/packer/plan_proto.h"

namespace tutti::tools {
namespace {

// The slowest rank's seconds for fn().
template <typename Fn>
double SlowestSeconds(Fn&& fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double worst = 0;
  MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Whether every rank's status is OK; the first failing rank's message on
// all ranks otherwise (so that every rank leaves the row alike).
absl::Status AllOk(const absl::Status& mine) {
  int bad = mine.ok() ? 0 : 1, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any == 0) return absl::OkStatus();
  return mine.ok() ? absl::AbortedError("another rank failed this exchange check") : mine;
}

// `list` with only `encoder`'s items (bytes recounted).
Transfers OfEncoder(const Transfers& list, v1::Encoder encoder) {
  Transfers out;
  for (const v1::Transfer& t : list) {
    v1::Transfer* u = out.Add();
    u->set_peer(t.peer());
    for (const v1::TransferItem& item : t.items()) {
      if (item.encoder() != encoder) continue;
      *u->add_items() = item;
      u->set_bytes(u->bytes() + item.bytes());
    }
  }
  return out;
}

// The items of `encoder` in its EncoderPhase's order, as one transfer: the
// layout of that encoder's output.
absl::StatusOr<Transfers> OutputOf(const v1::RankPlan& plan, v1::Encoder encoder) {
  std::map<std::pair<uint64_t, uint32_t>, const v1::TransferItem*> sent;
  for (const v1::Transfer& t : plan.exchange().sends()) {
    for (const v1::TransferItem& it : t.items()) {
      if (it.encoder() == encoder) sent[{it.sample_id(), it.index()}] = &it;
    }
  }
  Transfers out;
  v1::Transfer* all = out.Add();
  for (const v1::EncoderPhase& phase : plan.encoders()) {
    if (phase.encoder() != encoder) continue;
    std::vector<std::pair<uint64_t, uint32_t>> keys;
    for (const auto& ip : phase.images()) keys.emplace_back(ip.sample_id(), ip.image_index());
    for (const auto& ap : phase.audio()) keys.emplace_back(ap.sample_id(), ap.audio_index());
    for (const auto& key : keys) {
      auto it = sent.find(key);
      if (it == sent.end()) {
        return absl::InternalError(absl::StrCat("item (", key.first, ", ", key.second,
                                                ") of the encoder output is sent nowhere"));
      }
      *all->add_items() = *it->second;
      all->set_bytes(all->bytes() + it->second->bytes());
    }
  }
  return out;
}

uint64_t Total(const Transfers& list) {
  uint64_t n = 0;
  for (const v1::Transfer& t : list) n += t.bytes();
  return n;
}

// One encoder's buffers: its output (the forward send buffer, the backward
// receive buffer) and what its LLM side receives, grouped by source; the
// bare baseline's counts and offsets from the same layout.
struct EncoderCase {
  v1::Encoder encoder;
  ExchangeContext ctx;
  std::vector<uint8_t> output, received;
  std::vector<int> sc, sd, rc, rd;  // forward counts and displacements per peer
};

}  // namespace

absl::StatusOr<MpiWorld> InitMpiWorld() {
  RETURN_IF_ERROR(EnsureMpiInitialized());
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return MpiWorld{static_cast<uint32_t>(rank), static_cast<uint32_t>(size)};
}

absl::StatusOr<packer::TransportBenchResult> RunMpiExchangeBench(const MpiExchangeBenchOptions& o,
                                                                 const packer::Job& job,
                                                                 const packer::StepPlanData& plan) {
  ASSIGN_OR_RETURN(const MpiWorld world, InitMpiWorld());
  static MpiTransport* transport = [] {
    auto t = MpiTransport::CreateWorld();
    return t.ok() ? t->release() : nullptr;
  }();
  if (transport == nullptr) return absl::InternalError("could not create the MPI transport");
  const uint32_t W = plan.world_size, rank = world.rank;
  if (W != world.size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the plan is for ", W, " ranks but mpirun started ", world.size, "; run `mpirun -np ", W,
        " tutti bench exchange --transport mpi --ranks ", W, "`"));
  }
  v1::StepPlan step;
  const uint32_t ranks[] = {rank};
  RETURN_IF_ERROR(packer::BuildStepPlan(job, plan, ranks, &step));
  const v1::RankPlan& rp = step.ranks(0);

  // Each encoder with items in the step (every rank runs the same ones).
  uint64_t mine[2] = {0, 0}, any[2] = {0, 0};
  for (const v1::Transfer& t : rp.exchange().sends()) {
    for (const v1::TransferItem& it : t.items()) {
      mine[it.encoder() == v1::ENCODER_AUDIO ? 1 : 0] = 1;
    }
  }
  MPI_Allreduce(mine, any, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  std::vector<EncoderCase> cases;
  for (v1::Encoder e : {v1::ENCODER_VISION, v1::ENCODER_AUDIO}) {
    if (any[e == v1::ENCODER_AUDIO ? 1 : 0] == 0) continue;
    EncoderCase c;
    c.encoder = e;
    c.ctx = ExchangeContext{0, W};
    c.ctx.encoder = e;
    cases.push_back(std::move(c));
  }

  // Every byte, forward and backward, straight from and into each encoder's
  // output; one message per peer and direction counted.
  uint64_t messages = 0, pairs = 0;
  absl::Status s;
  for (EncoderCase& c : cases) {
    const Transfers sends = OfEncoder(rp.exchange().sends(), c.encoder);
    const Transfers recvs = OfEncoder(rp.exchange().recvs(), c.encoder);
    absl::StatusOr<Transfers> output = OutputOf(rp, c.encoder);
    if (!output.ok()) {
      s = output.status();
      break;
    }
    c.output.assign(Total(*output), 0);
    c.received.assign(Total(recvs), 0xAB);
    s = FillPattern(*output, kForwardSalt, c.output.data(), c.output.size());
    if (s.ok()) {
      s = transport->Exchange(rp, c.output.data(), c.output.size(), c.received.data(),
                              c.received.size(), c.ctx);
    }
    auto count = [&](const Transfers& list) {
      for (const v1::Transfer& t : list) {
        if (t.peer() == rank || t.bytes() == 0) continue;
        ++pairs;
        messages += transport->messages_sent_to()[t.peer()];
      }
    };
    if (s.ok()) count(sends);
    if (s.ok()) s = VerifyPattern(recvs, kForwardSalt, c.received.data(), c.received.size());
    if (s.ok()) s = FillPattern(recvs, kBackwardSalt, c.received.data(), c.received.size());
    std::fill(c.output.begin(), c.output.end(), 0xCD);
    if (s.ok()) {
      s = transport->ExchangeBackward(rp, c.received.data(), c.received.size(), c.output.data(),
                                      c.output.size(), c.ctx);
    }
    if (s.ok()) count(recvs);
    if (s.ok()) s = VerifyPattern(*output, kBackwardSalt, c.output.data(), c.output.size());
    if (!s.ok()) break;
  }
  RETURN_IF_ERROR(AllOk(Annotate(s, absl::StrCat("rank ", rank, " checking every byte"))));

  // The bare baseline: the same counts and offsets straight to MPI, one
  // buffer per peer in each direction.
  absl::Status fits;
  for (EncoderCase& c : cases) {
    absl::StatusOr<ExchangeLayout> layout =
        BuildExchangeLayout(rp, ExchangeDirection::kForward, rank, W, c.ctx);
    if (!layout.ok()) {
      fits = layout.status();
      break;
    }
    c.sc.assign(W, 0), c.sd.assign(W, 0), c.rc.assign(W, 0), c.rd.assign(W, 0);
    for (uint32_t p = 0; p < W && fits.ok(); ++p) {
      if (layout->send_offsets[p] + layout->send_counts[p] > INT_MAX ||
          layout->recv_offsets[p] + layout->recv_counts[p] > INT_MAX) {
        fits = absl::OutOfRangeError(
            "a rank exchanges more than 2 GiB: too large for a bare MPI_Alltoallv baseline; "
            "lower --hidden-size");
      }
      c.sc[p] = static_cast<int>(layout->send_counts[p]);
      c.sd[p] = static_cast<int>(layout->send_offsets[p]);
      c.rc[p] = static_cast<int>(layout->recv_counts[p]);
      c.rd[p] = static_cast<int>(layout->recv_offsets[p]);
    }
  }
  RETURN_IF_ERROR(AllOk(fits));
  static char empty;
  auto at = [](std::vector<uint8_t>& b) {
    return b.empty() ? static_cast<void*>(&empty) : static_cast<void*>(b.data());
  };
  auto bare = [&] {
    for (EncoderCase& c : cases) {
      MPI_Alltoallv(at(c.output), c.sc.data(), c.sd.data(), MPI_BYTE, at(c.received), c.rc.data(),
                    c.rd.data(), MPI_BYTE, MPI_COMM_WORLD);
      MPI_Alltoallv(at(c.received), c.rc.data(), c.rd.data(), MPI_BYTE, at(c.output), c.sc.data(),
                    c.sd.data(), MPI_BYTE, MPI_COMM_WORLD);
    }
  };
  absl::Status failed;
  auto client = [&] {
    for (EncoderCase& c : cases) {
      absl::Status e = transport->Exchange(rp, c.output.data(), c.output.size(), c.received.data(),
                                           c.received.size(), c.ctx);
      if (e.ok()) {
        e = transport->ExchangeBackward(rp, c.received.data(), c.received.size(), c.output.data(),
                                        c.output.size(), c.ctx);
      }
      if (!e.ok()) failed = e;
    }
  };
  std::vector<double> client_s, bare_s;
  for (uint32_t i = 0; i < o.warmup + o.iterations; ++i) {
    double c, b;
    if (i % 2 == 0) {
      c = SlowestSeconds(client);
      b = SlowestSeconds(bare);
    } else {
      b = SlowestSeconds(bare);
      c = SlowestSeconds(client);
    }
    if (i >= o.warmup) client_s.push_back(c), bare_s.push_back(b);
  }
  RETURN_IF_ERROR(AllOk(failed));
  double bytes = 0;  // this rank's forward send bytes
  for (const EncoderCase& c : cases) bytes += c.output.size();
  double all = 0, max_bytes = 0;
  MPI_Allreduce(&bytes, &all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&bytes, &max_bytes, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  all *= 2;  // forward and backward
  uint64_t counted[2] = {messages, pairs}, totals[2] = {0, 0};
  MPI_Allreduce(counted, totals, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  packer::TransportBenchResult r;
  const double c = Median(client_s), b = Median(bare_s);
  r.client_gbps = c > 0 ? all / c / 1e9 : 0;
  r.bare_gbps = b > 0 ? all / b / 1e9 : 0;
  r.client_vs_bare_throughput = c > 0 ? b / c : 0;
  r.bytes_per_rank_max = static_cast<uint64_t>(max_bytes);
  r.client_seconds = c;
  r.bare_seconds = b;
  r.messages_per_pair = totals[1] > 0 ? double(totals[0]) / totals[1] : 0;
  return r;
}

}  // namespace tutti::tools
