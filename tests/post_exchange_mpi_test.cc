// Post-balancing end to end over MPI: 8 ranks (2 "nodes" of 4) under mpirun
// in CI (any world size works: nodes of 4 ranks when it divides, else one
// node). Every rank plans 100 random steps with the packer's planning core (the
// full post-balancing dispatcher over a synthetic index), takes its own
// RankPlan as tutti-packerd would serve it, and runs the load, forward and
// backward exchanges through the client library's transport with buffers
// whose every byte encodes (sample, item, offset) (client/exchange_pattern.h).
// Every byte must arrive where the plan says, and every encoder output at
// the rank whose LLM phase holds its document. Half the steps restrict
// staging (each shard on one node), so inputs also travel the load exchange.
// Each encoder's exchange also runs on its own straight from that encoder's
// output (EncoderPhase order, grouped by destination), one message per peer
// and direction (the three-modality case: text, images, audio clips).
//
// With --transport=nccl (built with CUDA and NCCL; tools/gpu_check.sh) the
// buffers live in device memory and the exchanges run through NcclTransport
// (grouped ncclSend/ncclRecv), one rank per GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/exchange_pattern.h"
#include "client/mpi_test_support.h"
#include "client/mpi_transport.h"
#if TUTTI_HAVE_NCCL
#include "client/nccl_transport.h"
#endif
#include "common/job_config.h"
#include "services/packer/bench/staging.h"
#include "services/packer/bench/synthetic.h"
#include "services/packer/core/planner.h"
#include "services/packer/plan_proto.h"

namespace tutti {
namespace {

using Item = std::tuple<uint64_t, int, uint32_t>;  // sample id, encoder, index

constexpr int kSteps = 100;
bool g_nccl = false;  // --transport=nccl

using testing::WorldRank;
using testing::WorldSize;

uint32_t RanksPerNode(uint32_t world) { return world % 4 == 0 ? 4 : world; }

std::shared_ptr<const packer::Job> MakeJob(uint32_t world) {
  packer::SyntheticOptions o = packer::SyntheticFromWorkload(kSmallTestWorkload, 6000);
  o.max_text_tokens = 4000;
  o.audio_fraction = 0.25;
  o.fit_seq_len = 8192;
  o.fit_max_pixels = 1003520;
  o.samples_per_shard = 50;
  auto bytes = packer::MakeSyntheticIndex(o);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  auto index = packer::Index::FromString(*bytes, "synthetic.idx");
  EXPECT_TRUE(index.ok()) << index.status();
  auto config = ParseJobConfig(absl::StrCat(R"pb(
                                              seed: 11 world_size:)pb",
                                            world, R"pb(
                                              ranks_per_node:)pb",
                                            RanksPerNode(world), R"pb(
                                              batch { text_samples_per_step:)pb",
                                            8 * world, R"pb(
                                              vl_samples_per_step:)pb",
                                            3 * world, R"pb(
      grad_accum: 2
      text_micro_batch: 2
      vl_micro_batch: 1
      text_vl_ratio: "2:1"
    }
                                       curriculum { start_step: 0 max_pixels: 262144 seq_len: 8192 }
    post_balancing { enabled: true hidden_size: 64 }
  )pb"),
                               "post_exchange_mpi_test");
  EXPECT_TRUE(config.ok()) << config.status();
  ApplyJobDefaults(&*config);
  auto job = packer::Job::Create(*config, *index);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : nullptr;
}

std::multiset<Item> Listed(const Transfers& transfers) {
  std::multiset<Item> out;
  for (const auto& t : transfers) {
    for (const auto& it : t.items()) out.insert({it.sample_id(), it.encoder(), it.index()});
  }
  return out;
}

// Where the exchange buffers live: host memory (MPI) or, with NCCL, device
// memory filled from and checked against host copies.
class Buffers {
 public:
  explicit Buffers(bool device) : device_(device) {}
  ~Buffers() { Free(); }
  absl::Status Prepare(const std::vector<uint8_t>& send, size_t recv_bytes) {
    send_ = send;
    recv_.assign(recv_bytes, 0x5A);
    if (!device_) return absl::OkStatus();
#if TUTTI_HAVE_NCCL
    Free();
    if (absl::Status s =
            CudaStatus(cudaMalloc(&dsend_, std::max<size_t>(1, send.size())), "malloc");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CudaStatus(cudaMalloc(&drecv_, std::max<size_t>(1, recv_bytes)), "malloc");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CudaStatus(
            cudaMemcpy(dsend_, send.data(), send.size(), cudaMemcpyHostToDevice), "memcpy");
        !s.ok()) {
      return s;
    }
    return CudaStatus(cudaMemcpy(drecv_, recv_.data(), recv_bytes, cudaMemcpyHostToDevice),
                      "memcpy");
#else
    return absl::UnimplementedError("built without NCCL");
#endif
  }
  void* send() { return device_ ? dsend_ : static_cast<void*>(send_.data()); }
  void* recv() { return device_ ? drecv_ : static_cast<void*>(recv_.data()); }
  size_t send_bytes() const { return send_.size(); }
  size_t recv_bytes() const { return recv_.size(); }
  // The received bytes, on the host.
  absl::StatusOr<const std::vector<uint8_t>*> Received() {
#if TUTTI_HAVE_NCCL
    if (device_) {
      absl::Status s = CudaStatus(
          cudaMemcpy(recv_.data(), drecv_, recv_.size(), cudaMemcpyDeviceToHost), "memcpy");
      if (!s.ok()) return s;
    }
#endif
    return &recv_;
  }

 private:
  void Free() {
#if TUTTI_HAVE_NCCL
    if (dsend_) cudaFree(dsend_);
    if (drecv_) cudaFree(drecv_);
#endif
    dsend_ = drecv_ = nullptr;
  }
  bool device_;
  std::vector<uint8_t> send_, recv_;
  void* dsend_ = nullptr;
  void* drecv_ = nullptr;
};

// Runs one exchange with patterned buffers and checks every byte received.
absl::Status RunAndVerify(Transport& t, const v1::RankPlan& plan, ExchangeDirection dir,
                          uint64_t step, uint32_t world) {
  const v1::Exchange& x = dir == ExchangeDirection::kLoad ? plan.load_exchange() : plan.exchange();
  const bool back = dir == ExchangeDirection::kBackward;
  const Transfers& sends = back ? x.recvs() : x.sends();
  const Transfers& recvs = back ? x.sends() : x.recvs();
  const uint64_t salt = (back ? kBackwardSalt : kForwardSalt) ^ (step << 8) ^ uint64_t(dir);
  std::vector<uint8_t> send(back ? x.recv_bytes() : x.send_bytes());
  if (absl::Status s = FillPattern(sends, salt, send.data(), send.size()); !s.ok()) return s;
  Buffers b(g_nccl);
  if (absl::Status s = b.Prepare(send, back ? x.send_bytes() : x.recv_bytes()); !s.ok()) return s;
  const ExchangeContext ctx{step, world};
  absl::Status s =
      dir == ExchangeDirection::kForward
          ? t.Exchange(plan, b.send(), b.send_bytes(), b.recv(), b.recv_bytes(), ctx)
      : back ? t.ExchangeBackward(plan, b.send(), b.send_bytes(), b.recv(), b.recv_bytes(), ctx)
             : t.ExchangeLoad(plan, b.send(), b.send_bytes(), b.recv(), b.recv_bytes(), ctx);
  if (!s.ok()) return s;
  absl::StatusOr<const std::vector<uint8_t>*> got = b.Received();
  if (!got.ok()) return got.status();
  return VerifyPattern(recvs, salt, (*got)->data(), (*got)->size());
}

// `list` with only `encoder`'s items (bytes recounted): one encoder's layout.
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

// One encoder's forward and backward exchange straight from its output: the
// send buffer is laid out as the plan's EncoderPhase lists the encoder's
// items (the encoder's output rows as they stand), each item filled with its
// pattern; what arrives must be every item of the receives, grouped by
// source, and the gradients must come back into the output's layout. Each
// direction moves one message per peer (`sent_to`: the transport's count of
// its latest exchange; NCCL counts its own part too).
absl::Status RunEncoderAndVerify(Transport& t, const v1::RankPlan& plan, v1::Encoder encoder,
                                 uint64_t step, uint32_t world,
                                 const std::function<std::vector<uint64_t>()>& sent_to,
                                 uint64_t* messages, uint64_t* items) {
  const Transfers sends = OfEncoder(plan.exchange().sends(), encoder);
  const Transfers recvs = OfEncoder(plan.exchange().recvs(), encoder);
  // The encoder output: its items in EncoderPhase order, each its pattern.
  std::map<std::pair<uint64_t, uint32_t>, const v1::TransferItem*> sent;
  for (const v1::Transfer& tr : sends) {
    for (const v1::TransferItem& it : tr.items()) sent[{it.sample_id(), it.index()}] = &it;
  }
  Transfers output;  // one transfer holding the encoder's items in its output order
  v1::Transfer* all = output.Add();
  for (const v1::EncoderPhase& phase : plan.encoders()) {
    if (phase.encoder() != encoder) continue;
    std::vector<std::pair<uint64_t, uint32_t>> keys;
    for (const v1::ImagePlan& ip : phase.images())
      keys.emplace_back(ip.sample_id(), ip.image_index());
    for (const v1::AudioPlan& ap : phase.audio())
      keys.emplace_back(ap.sample_id(), ap.audio_index());
    for (const auto& key : keys) {
      auto it = sent.find(key);
      if (it == sent.end()) {
        return absl::InternalError(absl::StrCat("step ", step, ": item (", key.first, ", ",
                                                key.second,
                                                ") of the encoder output is sent "
                                                "nowhere"));
      }
      *all->add_items() = *it->second;
      all->set_bytes(all->bytes() + it->second->bytes());
    }
  }
  const uint64_t salt = kForwardSalt ^ (step << 8) ^ encoder;
  std::vector<uint8_t> out(all->bytes());
  if (absl::Status s = FillPattern(output, salt, out.data(), out.size()); !s.ok()) return s;
  uint64_t recv_bytes = 0;
  for (const v1::Transfer& tr : recvs) recv_bytes += tr.bytes();
  ExchangeContext ctx{step, world};
  ctx.encoder = encoder;
  auto one_per_peer = [&](const Transfers& list, const char* what) -> absl::Status {
    std::vector<uint64_t> want(world, 0);
    for (const v1::Transfer& tr : list) {
      if (tr.bytes() > 0 && (g_nccl || tr.peer() != t.rank())) want[tr.peer()] = 1;
      if (tr.bytes() > 0 && tr.peer() != t.rank()) {
        ++*messages;
        *items += tr.items_size();
      }
    }
    if (sent_to() == want) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("step ", step, ", encoder ", encoder, ", ", what,
                                            ": not one message per peer"));
  };
  {
    Buffers b(g_nccl);
    if (absl::Status s = b.Prepare(out, recv_bytes); !s.ok()) return s;
    absl::Status s = t.Exchange(plan, b.send(), b.send_bytes(), b.recv(), b.recv_bytes(), ctx);
    if (!s.ok()) return s;
    if (absl::Status c = one_per_peer(sends, "forward"); !c.ok()) return c;
    absl::StatusOr<const std::vector<uint8_t>*> got = b.Received();
    if (!got.ok()) return got.status();
    if (absl::Status v = VerifyPattern(recvs, salt, (*got)->data(), (*got)->size()); !v.ok()) {
      return v;
    }
  }
  std::vector<uint8_t> grad(recv_bytes);
  if (absl::Status s = FillPattern(recvs, ~salt, grad.data(), grad.size()); !s.ok()) return s;
  Buffers b(g_nccl);
  if (absl::Status s = b.Prepare(grad, out.size()); !s.ok()) return s;
  absl::Status s =
      t.ExchangeBackward(plan, b.send(), b.send_bytes(), b.recv(), b.recv_bytes(), ctx);
  if (!s.ok()) return s;
  if (absl::Status c = one_per_peer(recvs, "backward"); !c.ok()) return c;
  absl::StatusOr<const std::vector<uint8_t>*> got = b.Received();
  if (!got.ok()) return got.status();
  return VerifyPattern(output, ~salt, (*got)->data(), (*got)->size());
}

// The transport under test: MPI, or NCCL with MPI for the agreement.
struct TransportUnderTest {
  std::unique_ptr<MpiTransport> mpi;
#if TUTTI_HAVE_NCCL
  std::unique_ptr<NcclTransport> nccl;
#endif
  Transport* get() {
#if TUTTI_HAVE_NCCL
    if (nccl) return nccl.get();
#endif
    return mpi.get();
  }
  // Messages (ncclSend calls) to each peer in the latest exchange.
  std::vector<uint64_t> sent_to() const {
#if TUTTI_HAVE_NCCL
    if (nccl) return nccl->messages_sent_to();
#endif
    return mpi->messages_sent_to();
  }
};

absl::StatusOr<TransportUnderTest> MakeTransport() {
  MpiTransportOptions topts;
  topts.join_timeout = absl::Seconds(30);
  TransportUnderTest t;
  auto mpi = MpiTransport::Create(MPI_COMM_WORLD, topts);
  if (!mpi.ok()) return mpi.status();
  t.mpi = std::move(*mpi);
  if (!g_nccl) return t;
#if TUTTI_HAVE_NCCL
  int devices = 0;
  if (absl::Status s = CudaStatus(cudaGetDeviceCount(&devices), "cudaGetDeviceCount"); !s.ok()) {
    return s;
  }
  NcclTransportOptions no;
  no.synchronize = true;
  auto nccl = NcclTransport::CreateWithMpi(
      MPI_COMM_WORLD, static_cast<int>(t.mpi->rank()) % devices, nullptr, t.mpi.get(), no);
  if (!nccl.ok()) return nccl.status();
  t.nccl = std::move(*nccl);
  return t;
#else
  return absl::FailedPreconditionError(
      "--transport=nccl: this build has no NCCL transport (cmake -DTUTTI_WITH_CUDA=ON where CUDA "
      "and NCCL are found)");
#endif
}

TEST(PostExchangeMpiTest, EveryByteOfEverySampleArrivesWhereThePlanSays) {
  const uint32_t world = WorldSize(), rank = WorldRank();
  auto job = MakeJob(world);
  ASSERT_NE(job, nullptr);
  packer::ShardsOnNodes staging(job->index().num_shards(), world / RanksPerNode(world));
  const packer::Planner everywhere(job), restricted(job, &staging);
  // Every rank reaches the same verdict on creating the transport.
  absl::StatusOr<TransportUnderTest> transport = MakeTransport();
  int bad = transport.ok() ? 0 : 1, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  ASSERT_TRUE(transport.ok()) << transport.status();
  ASSERT_EQ(any, 0) << "another rank could not create the transport";
  if (rank == 0)
    std::printf("transport: %s, %u ranks\n", std::string(transport->get()->name()).c_str(), world);

  std::mt19937_64 rng(2024);  // the same steps on every rank
  uint64_t forward_bytes = 0, load_bytes = 0, inter_node = 0, moved_items = 0;
  uint64_t pair_messages = 0, pair_items = 0;  // per encoder, between ranks
  packer::StepPlanData data;
  for (int k = 0; k < kSteps; ++k) {
    const uint64_t step = rng() % 100000;
    const bool remote = k % 2 == 1;
    absl::Status status = (remote ? restricted : everywhere).Plan(step, &data);
    v1::StepPlan plan;
    if (status.ok()) status = packer::BuildStepPlan(*job, data, {rank}, &plan);
    ASSERT_TRUE(status.ok()) << "step " << step << ": " << status;
    ASSERT_EQ(plan.ranks_size(), 1);
    const v1::RankPlan& rp = plan.ranks(0);
    ASSERT_EQ(rp.rank(), rank);

    // The plan's own promise: this rank receives the encoder output of every
    // image and clip of the documents in its LLM sequences, and the inputs it
    // encodes or packs but whose shard its node does not stage.
    std::map<uint64_t, const v1::SampleInfo*> info;
    for (const auto& s : plan.samples()) info[s.sample_id()] = &s;
    std::multiset<Item> outputs, loads;
    for (const auto& mb : rp.micro_batches()) {
      for (const auto& seq : mb.sequences()) {
        for (const auto& doc : seq.docs()) {
          const v1::SampleInfo& s = *info.at(doc.sample_id());
          for (int i = 0; i < s.images_size(); ++i) {
            outputs.insert({s.sample_id(), v1::ENCODER_VISION, i});
          }
          for (int a = 0; a < s.audio_size(); ++a) {
            outputs.insert({s.sample_id(), v1::ENCODER_AUDIO, a});
          }
          if (doc.remote_load()) loads.insert({s.sample_id(), v1::ENCODER_UNSPECIFIED, 0});
        }
      }
    }
    for (const auto& e : rp.encoders()) {
      for (const auto& im : e.images()) {
        if (im.remote_load()) loads.insert({im.sample_id(), v1::ENCODER_VISION, im.image_index()});
      }
      for (const auto& au : e.audio()) {
        if (au.remote_load()) loads.insert({au.sample_id(), v1::ENCODER_AUDIO, au.audio_index()});
      }
    }
    EXPECT_EQ(Listed(rp.exchange().recvs()), outputs) << "step " << step;
    EXPECT_EQ(Listed(rp.load_exchange().recvs()), loads) << "step " << step;

    for (ExchangeDirection dir :
         {ExchangeDirection::kLoad, ExchangeDirection::kForward, ExchangeDirection::kBackward}) {
      status = RunAndVerify(*transport->get(), rp, dir, step, world);
      // Stop every rank at the first failure anywhere (exchanges are collective).
      int bad = status.ok() ? 0 : 1, any = 0;
      MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      ASSERT_TRUE(status.ok()) << "step " << step << " " << ExchangeDirectionName(dir) << ": "
                               << status;
      ASSERT_EQ(any, 0) << "another rank failed step " << step;
    }
    // Each encoder's exchange straight from that encoder's output: one
    // message per peer and direction.
    for (v1::Encoder encoder : {v1::ENCODER_VISION, v1::ENCODER_AUDIO}) {
      status = RunEncoderAndVerify(
          *transport->get(), rp, encoder, step, world, [&] { return transport->sent_to(); },
          &pair_messages, &pair_items);
      int bad = status.ok() ? 0 : 1, any = 0;
      MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      ASSERT_TRUE(status.ok()) << "step " << step << " encoder " << encoder << ": " << status;
      ASSERT_EQ(any, 0) << "another rank failed step " << step;
    }
    forward_bytes += rp.exchange().send_bytes();
    load_bytes += rp.load_exchange().send_bytes();
    inter_node += rp.exchange().inter_node_send_bytes();
    moved_items += outputs.size();
  }
  uint64_t mine[5] = {forward_bytes, load_bytes, inter_node, pair_messages, pair_items},
           all[5] = {};
  MPI_Allreduce(mine, all, 5, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  if (world > 1) {
    // Pairs carry several items each, yet move as one message per direction.
    EXPECT_GT(all[4], all[3]) << all[3] << " messages for " << all[4] << " items";
  }
  EXPECT_GT(all[0], 0u);
  if (world / RanksPerNode(world) > 1) {
    EXPECT_GT(all[1], 0u) << "the restricted steps moved no inputs";
  }
  if (rank == 0) {
    std::printf(
        "%d steps: %llu forward bytes (%llu between nodes), %llu load bytes; per encoder %llu "
        "messages between ranks for %llu items, forward and backward\n",
        kSteps, static_cast<unsigned long long>(all[0]), static_cast<unsigned long long>(all[2]),
        static_cast<unsigned long long>(all[1]), static_cast<unsigned long long>(all[3]),
        static_cast<unsigned long long>(all[4]));
  }
  EXPECT_GT(moved_items, 0u);
}

}  // namespace
}  // namespace tutti

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--transport=nccl") {
      tutti::g_nccl = true;
    } else if (arg != "--transport=mpi") {
      std::fprintf(stderr, "unknown argument %s (use --transport=mpi or --transport=nccl)\n",
                   argv[i]);
      MPI_Finalize();
      return 2;
    }
  }
  return tutti::testing::RunAllTestsOnEveryRank();
}
