// A small trainer-side program built against the installed tutti package:
// resolves its options from a Slurm-like environment, lays out a plan's
// exchange, and connects to daemons that are not there (the error must name
// the setting to fix). Prints "ok" and exits 0 when everything holds.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>

#include "client/batch.h"
#include "client/client.h"
#include "client/mpi_transport.h"
#include "client/transport.h"

// The client headers on their own pull in neither protobuf nor gRPC.
#if defined(GOOGLE_PROTOBUF_VERSION) || defined(GRPC_IMPL_CODEGEN_PORT_PLATFORM_H) || \
    defined(GRPCPP_GRPCPP_H)
#error "the tutti client headers include protobuf or gRPC headers"
#endif

// Reading the plan's fields takes the installed message headers.
#include "tutti/v1/packer.pb.h"
#include "tutti/v1/plan.pb.h"

namespace {

int failures = 0;

void Expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    ++failures;
  }
}

// A loopback port nothing listens on (bound, then closed).
int ClosedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return 1;
  }
  close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

int main() {
  const std::map<std::string, std::string> env = {{"TUTTI_STAGER", "127.0.0.1:1"},
                                                  {"TUTTI_PACKER", "127.0.0.1:2"},
                                                  {"SLURM_PROCID", "3"},
                                                  {"SLURM_NTASKS", "4"}};
  auto opts = tutti::ResolveClientOptions({}, [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  Expect(opts.ok(), "ResolveClientOptions: " + opts.status().ToString());
  if (opts.ok()) {
    Expect(opts->rank == 3 && opts->world_size == 4, "rank and world size from SLURM_*");
  }

  // Rank 0 of 2 sends 8 bytes to itself and 24 to rank 1, receives 8 from itself.
  tutti::v1::RankPlan plan;
  plan.set_rank(0);
  plan.set_plan_version(tutti::kMinExchangePlanVersion);
  auto* ex = plan.mutable_exchange();
  auto add = [](auto* list, uint32_t peer, uint64_t bytes) {
    auto* t = list->Add();
    t->set_peer(peer);
    t->set_bytes(bytes);
    auto* item = t->add_items();
    item->set_sample_id(peer);
    item->set_bytes(bytes);
  };
  add(ex->mutable_sends(), 0, 8);
  add(ex->mutable_sends(), 1, 24);
  add(ex->mutable_recvs(), 0, 8);
  ex->set_send_bytes(32);
  ex->set_recv_bytes(8);
  auto layout = tutti::BuildExchangeLayout(plan, tutti::ExchangeDirection::kForward, 0, 2);
  Expect(layout.ok(), "BuildExchangeLayout: " + layout.status().ToString());
  if (layout.ok()) {
    Expect(layout->send_counts == std::vector<uint64_t>{8, 24} && layout->send_offsets[1] == 8 &&
               layout->recv_bytes == 8,
           "the layout follows the plan");
  }

  tutti::ClientOptions copts;
  copts.packer_address = "127.0.0.1:" + std::to_string(ClosedPort());
  copts.stager_address = copts.packer_address;
  copts.rank = 0;
  copts.world_size = 1;
  copts.connect_timeout = absl::Milliseconds(300);
  copts.rpc_timeout = absl::Milliseconds(200);
  auto client = tutti::Client::Connect(copts);
  Expect(absl::IsUnavailable(client.status()),
         "Connect to no packer is UNAVAILABLE: " + client.status().ToString());
  Expect(client.status().message().find("TUTTI_PACKER") != absl::string_view::npos,
         "the error names TUTTI_PACKER: " + client.status().ToString());

  if (failures == 0) std::printf("ok\n");
  return failures == 0 ? 0 : 1;
}
