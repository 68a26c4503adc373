// tutti-stagerd: one per node. Stages the job's shards into a node-local
// cache, decodes what this node's ranks' plans name and hands ready batches
// to local clients through shared memory. Runs until SIGTERM/SIGINT, then
// shuts down cleanly (segments unlinked, exit 0).
#include <signal.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "common/byte_size.h"
#include "common/daemon_flags.h"
#include "services/stager/stager_server.h"

ABSL_FLAG(std::string, packer, "127.0.0.1:7070", "tutti-packerd address (host:port)");
ABSL_FLAG(
    std::string, node, "0",
    "this node's index (its ranks are node*ranks_per_node .. +ranks_per_node-1), or 'auto': "
    "learn it from the first AcquireBatch (node = rank / ranks_per_node), as a DaemonSet must; "
    "a later client of another node is then refused");
ABSL_FLAG(std::string, source, "",
          "dataset source directory (e.g. an NFS mount) holding the shards");
ABSL_FLAG(std::string, cache, "", "node-local cache directory (NVMe); one daemon per directory");
ABSL_FLAG(std::string, listen, "127.0.0.1:7071",
          "gRPC address to serve: HOST:PORT (port 0 = any free port) or unix:///PATH/TO.sock (a "
          "Unix-domain socket, e.g. on a hostPath shared with the training pods)");
ABSL_FLAG(std::string, metrics, "127.0.0.1:9471", "address for /metrics (port 0 = any free port)");
ABSL_FLAG(std::string, port_file, "",
          "write 'grpc=PORT\\nmetrics=PORT\\ngrpc_address=ADDRESS\\n' here once serving (PORT 0 "
          "for a Unix socket)");
ABSL_FLAG(std::string, cache_capacity, "0", "cache byte capacity, e.g. 500G (0 = unlimited)");
ABSL_FLAG(uint32_t, queue_depth, 64, "staging reads/writes in flight (one block buffer each)");
ABSL_FLAG(std::string, block_size, "1M", "staging block size, a multiple of 4K");
ABSL_FLAG(uint32_t, max_files, 32, "shards copied at the same time");
ABSL_FLAG(bool, o_direct, true, "write the cache with O_DIRECT (falls back where refused)");
ABSL_FLAG(bool, o_direct_source, false, "read the source with O_DIRECT");
ABSL_FLAG(bool, io_uring, true, "use io_uring (false: a thread pool doing pread/pwrite)");
ABSL_FLAG(uint32_t, decode_threads, 0, "decode threads (0 = one per core)");
ABSL_FLAG(uint32_t, window, 4, "steps of ready batches kept ahead per local rank");
ABSL_FLAG(uint32_t, stage_ahead, 16, "steps beyond the window whose shards are staged early");
ABSL_FLAG(std::string, memory_budget, "8G", "shared memory that batches may hold in total");
ABSL_FLAG(uint32_t, sample_deadline_ms, 0, "per-sample read+decode deadline (0 = the job's)");
ABSL_FLAG(std::string, skip_policy, "",
          "'drop' or 'substitute' for late/corrupt samples (empty = the job's)");
ABSL_FLAG(uint32_t, stage_wait_ms, 0,
          "how long a batch waits for its shards before reading the source directly (0 = the "
          "sample deadline)");
ABSL_FLAG(uint32_t, staging_timeout_ms, 30000,
          "one staging read/write; a stalled source fails the shard after this");
ABSL_FLAG(uint32_t, packer_wait_s, 600, "how long to retry reaching the packer at start");

int main(int argc, char** argv) {
  tutti::ParseFlags(
      argc, argv,
      "stages, decodes and serves the batches of one node's ranks.\n"
      "usage: tutti-stagerd --packer HOST:PORT --node N --source DIR --cache DIR [options]\n"
      "Stages the job's shards into the node-local cache, decodes what this node's ranks' plans\n"
      "name and hands ready batches to local clients through shared memory.",
      "services/stager/main.cc");
  tutti::stager::StagerServerOptions o;
  o.packer = absl::GetFlag(FLAGS_packer);
  o.listen = absl::GetFlag(FLAGS_listen);
  o.metrics = absl::GetFlag(FLAGS_metrics);
  o.port_file = absl::GetFlag(FLAGS_port_file);
  o.packer_wait = absl::Seconds(absl::GetFlag(FLAGS_packer_wait_s));
  auto& c = o.core;
  const std::string node = absl::GetFlag(FLAGS_node);
  if (node == "auto") {
    c.node_auto = true;
  } else if (!absl::SimpleAtoi(node, &c.node)) {
    std::fprintf(stderr, "tutti-stagerd: --node '%s' is neither a node index nor 'auto'\n",
                 node.c_str());
    return 2;
  }
  c.cache_dir = absl::GetFlag(FLAGS_cache);
  c.staging.source_dir = absl::GetFlag(FLAGS_source);
  uint64_t block = 0;
  for (auto [name, text, out] :
       {std::tuple{"cache_capacity", absl::GetFlag(FLAGS_cache_capacity), &c.cache_capacity_bytes},
        std::tuple{"memory_budget", absl::GetFlag(FLAGS_memory_budget), &c.memory_budget_bytes},
        std::tuple{"block_size", absl::GetFlag(FLAGS_block_size), &block}}) {
    if (!tutti::ParseByteSize(text, out)) {
      std::fprintf(stderr, "tutti-stagerd: --%s '%s' is not a size like 64K, 1M or 500G\n", name,
                   text.c_str());
      return 2;
    }
  }
  c.staging.block_size = block;
  c.staging.queue_depth = absl::GetFlag(FLAGS_queue_depth);
  c.staging.max_files = absl::GetFlag(FLAGS_max_files);
  c.staging.o_direct = absl::GetFlag(FLAGS_o_direct);
  c.staging.o_direct_source = absl::GetFlag(FLAGS_o_direct_source);
  c.staging.use_io_uring = c.use_io_uring = absl::GetFlag(FLAGS_io_uring);
  c.staging.op_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_staging_timeout_ms));
  c.decode_threads = absl::GetFlag(FLAGS_decode_threads);
  c.window = absl::GetFlag(FLAGS_window);
  c.stage_ahead = absl::GetFlag(FLAGS_stage_ahead);
  c.sample_deadline_ms = absl::GetFlag(FLAGS_sample_deadline_ms);
  c.skip_policy = absl::GetFlag(FLAGS_skip_policy);
  c.stage_wait_ms = absl::GetFlag(FLAGS_stage_wait_ms);
  if (c.staging.source_dir.empty() || c.cache_dir.empty()) {
    std::fprintf(stderr, "tutti-stagerd: --source and --cache are required (see --help)\n");
    return 2;
  }
  // Signals are taken by sigwait below, not by a handler.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  tutti::stager::StagerServer server(o);
  absl::Status s = server.Start();
  if (!s.ok()) {
    std::fprintf(stderr, "tutti-stagerd: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const std::string mhost = o.metrics.substr(0, o.metrics.rfind(':'));
  std::printf("tutti-stagerd node %s listening on %s (metrics %s:%d)\n", node.c_str(),
              server.grpc_address().c_str(), mhost.c_str(), server.metrics_port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  std::printf("tutti-stagerd: signal %d, shutting down\n", sig);
  server.Shutdown();
  return 0;
}
