#include "services/stager/stagerd_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/daemon_flags.h"
#include "common/security_flags.h"
#include "common/status.h"
#include "services/stager/peer_fetcher.h"

ABSL_FLAG(std::string, packer, "127.0.0.1:7070",
          "tutti-packerd address: HOST:PORT or unix:///PATH/TO.sock");
ABSL_FLAG(std::string, node, "0",
          "this node's index (its ranks are node*ranks_per_node .. +ranks_per_node-1), or 'auto': "
          "learn it from the first rank that registers or asks for a batch (node = rank / "
          "ranks_per_node), as a DaemonSet must; "
          "a later client of another node is then refused");
ABSL_FLAG(std::string, source, "",
          "dataset source directory (e.g. an NFS mount) holding the shards; required");
ABSL_FLAG(std::string, cache, "",
          "node-local cache directory (NVMe); one daemon per directory; required");
ABSL_FLAG(std::string, listen, "127.0.0.1:7071",
          "gRPC address to serve: HOST:PORT (port 0 = any free port) or unix:///PATH/TO.sock (a "
          "Unix-domain socket, e.g. on a hostPath shared with the training pods)");
ABSL_FLAG(std::string, peer_listen, "",
          "a second gRPC address, HOST:PORT (port 0 = any free port), serving only other nodes' "
          "stagers (FetchMembers, their --peers) and health, with the same token and TLS; a "
          "rank's call there is refused. For a stager whose --listen is a Unix socket; empty = "
          "none (other stagers ask --listen)");
ABSL_FLAG(std::string, metrics, "127.0.0.1:9471",
          "HOST:PORT serving /metrics, /healthz and /readyz (port 0 = any free port)");
ABSL_FLAG(std::string, socket_group, "",
          "group (name or GID) that may use this daemon: a Unix socket (--listen unix:) is "
          "created 0660 and the batch segments in /dev/shm 0640 with that group, so training "
          "processes in it need not run as the daemon's user (empty = the daemon's own group); "
          "every connection to the socket is checked by its peer's credentials: root, the "
          "daemon's user and members of that group only, whatever the socket file's mode");
ABSL_FLAG(std::string, port_file, "",
          "write 'metrics=PORT\\n' here at once (probes may start), then "
          "'grpc=PORT\\nmetrics=PORT\\ngrpc_address=ADDRESS\\n' once serving (PORT 0 for a Unix "
          "socket), before /readyz first says ready");
ABSL_FLAG(std::string, cache_capacity, "0",
          "cache byte capacity, 64M to 1P, e.g. 500G (0 = unlimited)");
ABSL_FLAG(uint32_t, queue_depth, 64,
          "staging reads/writes in flight (one block buffer each), 1..4096");
ABSL_FLAG(std::string, block_size, "1M", "staging block size, 4K to 64M, a multiple of 4K");
ABSL_FLAG(uint32_t, max_files, 32, "shards copied at the same time, 1..4096");
ABSL_FLAG(uint32_t, source_file_ops, 4,
          "operations on one source file in flight, for its staging and for member reads of it "
          "each, stuck ones included, 1..1024: what a file that stops answering can hold of "
          "the workers and buffers (keep the two together under a FUSE mount's background "
          "limit, 12 by default)");
ABSL_FLAG(bool, o_direct, true, "write the cache with O_DIRECT (falls back where refused)");
ABSL_FLAG(bool, o_direct_source, false, "read the source with O_DIRECT");
ABSL_FLAG(std::string, io_backend, "auto",
          "file I/O for staging and member reads: 'uring' (io_uring), 'pread' (a thread pool "
          "doing pread/pwrite) or 'auto' (io_uring, or pread with one log line where io_uring "
          "is refused, e.g. by a container's seccomp profile)");
ABSL_FLAG(std::string, path_resolve, "auto",
          "how shard files are opened beneath --source and --cache, never through a symlink or "
          "'..' out of them: 'auto' (openat2 RESOLVE_BENEATH where the kernel has it, else a "
          "checked walk with O_NOFOLLOW), 'openat2' (refuse to start without it) or 'walk'");
ABSL_FLAG(uint32_t, decode_threads, 0,
          "decode threads, 0..1024 (0 = one per CPU this process may use: its affinity and its "
          "cgroup's cpu.max)");
ABSL_FLAG(uint32_t, window, 4, "steps of ready batches kept ahead per local rank, 1..256");
ABSL_FLAG(uint32_t, stage_ahead, 16,
          "steps beyond the window whose shards are staged early, 0..4096");
ABSL_FLAG(std::string, memory_budget, "8G",
          "shared memory that batches may hold in total, 16M to 1P");
ABSL_FLAG(uint32_t, sample_deadline_ms, 0,
          "per-sample read+decode deadline, 0..3600000 (0 = the job's)");
ABSL_FLAG(std::string, skip_policy, "",
          "'drop' or 'substitute' for late/corrupt samples (empty = the job's)");
ABSL_FLAG(uint32_t, stage_wait_ms, 0,
          "how long a batch waits for its shards before reading the source directly, "
          "0..3600000 (0 = the sample deadline)");
ABSL_FLAG(uint32_t, staging_timeout_ms, 30000,
          "one staging read/write, 100..3600000; a stalled source fails the shard after this");
ABSL_FLAG(uint32_t, lease_seconds, 60,
          "how long a batch handed to a client that renews its leases (libtutti does, about "
          "every quarter of this) stays held without a renewal, and how long such a client's "
          "rank may stay silent before it is taken as gone: its batches are freed and the "
          "window no longer waits for it until it calls again; 1..86400");
ABSL_FLAG(uint32_t, max_acquire_timeout_ms, 3600000,
          "the longest an AcquireBatch may ask to wait for its batch (timeout_ms), "
          "60000..86400000; a longer one is refused INVALID_ARGUMENT (libtutti asks for at most "
          "a minute at a time and asks again)");
ABSL_FLAG(std::string, peers, "",
          "the other nodes' stagers, NODE=HOST:PORT,... (their --peer_listen, else --listen, "
          "addresses): a remote_load item whose plan names its holder node (the job's "
          "locality) is asked of that node's stager first, then read from the source; empty = "
          "always the source");
ABSL_FLAG(uint32_t, peer_timeout_ms, 0,
          "how long a holder's stager has to send a remote_load member before it is read from "
          "the source, 0..3600000, within the sample deadline (0 = half of what is left of it)");
ABSL_FLAG(uint32_t, packer_wait_s, 600,
          "how long to retry reaching the packer at start, 0..86400 (SIGTERM ends the wait at "
          "once)");

namespace tutti::stager {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kPiB = uint64_t{1} << 50;

}  // namespace

absl::StatusOr<StagerServerOptions> StagerOptionsFromFlags() {
  StagerServerOptions o;
  o.packer = absl::GetFlag(FLAGS_packer);
  o.listen = absl::GetFlag(FLAGS_listen);
  o.metrics = absl::GetFlag(FLAGS_metrics);
  o.port_file = absl::GetFlag(FLAGS_port_file);
  RETURN_IF_ERROR(CheckAddressFlag("packer", o.packer, AddressUse::kConnect, true));
  RETURN_IF_ERROR(CheckAddressFlag("listen", o.listen, AddressUse::kServe, true));
  RETURN_IF_ERROR(CheckAddressFlag("metrics", o.metrics, AddressUse::kServe, false));
  o.peer_listen = absl::GetFlag(FLAGS_peer_listen);
  if (!o.peer_listen.empty()) {
    RETURN_IF_ERROR(CheckAddressFlag("peer_listen", o.peer_listen, AddressUse::kServe, false));
  }
  StagerOptions& c = o.core;
  const std::string node = absl::GetFlag(FLAGS_node);
  if (node == "auto") {
    c.node_auto = true;
  } else if (!absl::SimpleAtoi(node, &c.node)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--node '", node, "' is neither a node index nor 'auto'"));
  }
  if (const std::string group = absl::GetFlag(FLAGS_socket_group); !group.empty()) {
    ASSIGN_OR_RETURN(c.share_gid, GroupFlag("socket_group", group));
  }
  c.cache_dir = absl::GetFlag(FLAGS_cache);
  c.staging.source_dir = absl::GetFlag(FLAGS_source);
  if (c.staging.source_dir.empty() || c.cache_dir.empty()) {
    return absl::InvalidArgumentError("--source and --cache are required");
  }
  ASSIGN_OR_RETURN(c.cache_capacity_bytes,
                   ByteSizeFlag("cache_capacity", absl::GetFlag(FLAGS_cache_capacity), 64 * kMiB,
                                kPiB, "unlimited"));
  ASSIGN_OR_RETURN(c.memory_budget_bytes, ByteSizeFlag("memory_budget",
                                                       absl::GetFlag(FLAGS_memory_budget),
                                                       16 * kMiB, kPiB));
  ASSIGN_OR_RETURN(const uint64_t block,
                   ByteSizeFlag("block_size", absl::GetFlag(FLAGS_block_size), 4096, 64 * kMiB));
  if (block % 4096 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block_size ", absl::GetFlag(FLAGS_block_size),
                     " is not a multiple of 4K (O_DIRECT needs aligned blocks)"));
  }
  c.staging.block_size = block;
  struct Range {
    const char* flag;
    uint32_t value, lo, hi;
    const char* meaning;
  };
  for (const Range& r : {
           Range{"queue_depth", absl::GetFlag(FLAGS_queue_depth), 1, 4096, ""},
           Range{"max_files", absl::GetFlag(FLAGS_max_files), 1, 4096, ""},
           Range{"source_file_ops", absl::GetFlag(FLAGS_source_file_ops), 1, 1024, ""},
           Range{"decode_threads", absl::GetFlag(FLAGS_decode_threads), 0, 1024,
                 "0 = one per CPU this process may use"},
           Range{"window", absl::GetFlag(FLAGS_window), 1, 256, ""},
           Range{"stage_ahead", absl::GetFlag(FLAGS_stage_ahead), 0, 4096, ""},
           Range{"sample_deadline_ms", absl::GetFlag(FLAGS_sample_deadline_ms), 0, 3600000,
                 "0 = the job's"},
           Range{"stage_wait_ms", absl::GetFlag(FLAGS_stage_wait_ms), 0, 3600000,
                 "0 = the sample deadline"},
           Range{"staging_timeout_ms", absl::GetFlag(FLAGS_staging_timeout_ms), 100, 3600000, ""},
           Range{"packer_wait_s", absl::GetFlag(FLAGS_packer_wait_s), 0, 86400, ""},
           Range{"peer_timeout_ms", absl::GetFlag(FLAGS_peer_timeout_ms), 0, 3600000,
                 "0 = half of what is left of the sample deadline"},
           Range{"lease_seconds", absl::GetFlag(FLAGS_lease_seconds), 1, 86400, ""},
           Range{"max_acquire_timeout_ms", absl::GetFlag(FLAGS_max_acquire_timeout_ms), 60000,
                 86400000, ""},
       }) {
    RETURN_IF_ERROR(CheckFlagRange(r.flag, r.value, r.lo, r.hi, r.meaning));
  }
  if (uint64_t{absl::GetFlag(FLAGS_queue_depth)} * block > kMaxStagingBuffers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--queue_depth ", absl::GetFlag(FLAGS_queue_depth), " x --block_size ",
        absl::GetFlag(FLAGS_block_size), " is more than 4G of staging buffers (one per read or "
        "write in flight, allocated at start); lower one of them"));
  }
  c.staging.queue_depth = absl::GetFlag(FLAGS_queue_depth);
  c.staging.max_files = absl::GetFlag(FLAGS_max_files);
  c.staging.file_queue_depth = absl::GetFlag(FLAGS_source_file_ops);
  c.source_file_reads = absl::GetFlag(FLAGS_source_file_ops);
  c.staging.o_direct = absl::GetFlag(FLAGS_o_direct);
  c.staging.o_direct_source = absl::GetFlag(FLAGS_o_direct_source);
  ASSIGN_OR_RETURN(c.io_backend, ParseIoBackendChoice(absl::GetFlag(FLAGS_io_backend)));
  ASSIGN_OR_RETURN(c.staging.resolve, ParseResolveMode(absl::GetFlag(FLAGS_path_resolve)));
  c.staging.op_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_staging_timeout_ms));
  c.decode_threads = absl::GetFlag(FLAGS_decode_threads);
  c.window = absl::GetFlag(FLAGS_window);
  c.stage_ahead = absl::GetFlag(FLAGS_stage_ahead);
  c.sample_deadline_ms = absl::GetFlag(FLAGS_sample_deadline_ms);
  c.stage_wait_ms = absl::GetFlag(FLAGS_stage_wait_ms);
  c.lease = absl::Seconds(absl::GetFlag(FLAGS_lease_seconds));
  c.max_acquire_timeout_ms = absl::GetFlag(FLAGS_max_acquire_timeout_ms);
  c.skip_policy = absl::GetFlag(FLAGS_skip_policy);
  if (!c.skip_policy.empty() && c.skip_policy != "drop" && c.skip_policy != "substitute") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--skip_policy '", c.skip_policy, "' is unknown: use 'drop' or 'substitute' (or leave it "
        "empty for the job's)"));
  }
  o.packer_wait = absl::Seconds(absl::GetFlag(FLAGS_packer_wait_s));
  ASSIGN_OR_RETURN(o.peers, ParsePeers(absl::GetFlag(FLAGS_peers)));
  for (const auto& [peer, address] : o.peers) {
    RETURN_IF_ERROR(CheckAddressFlag("peers", address, AddressUse::kConnect, false));
  }
  c.peer_timeout_ms = absl::GetFlag(FLAGS_peer_timeout_ms);
  // The certificates are checked against the address that serves TLS:
  // --peer_listen when --listen is a Unix socket.
  ASSIGN_OR_RETURN(o.rpc,
                   RpcGateOptionsFromFlags(o.peer_listen.empty() ? o.listen : o.peer_listen));
  return o;
}

DaemonMain StagerdMain() {
  DaemonMain m;
  m.name = "tutti-stagerd";
  m.usage =
      "stages, decodes and serves the batches of one node's ranks.\n"
      "usage: tutti-stagerd --packer HOST:PORT --node N --source DIR --cache DIR [options]\n"
      "Stages the job's shards into the node-local cache, decodes what this node's ranks' plans\n"
      "name and hands ready batches to local clients through shared memory. Ready (/readyz,\n"
      "gRPC health) while its cache is usable, its source reachable and the packer answering.";
  m.flag_files = {"services/stager/stagerd_flags.cc", "common/security_flags.cc"};
  m.make = []() -> absl::StatusOr<std::unique_ptr<Daemon>> {
    ASSIGN_OR_RETURN(StagerServerOptions o, StagerOptionsFromFlags());
    return std::unique_ptr<Daemon>(std::make_unique<StagerServer>(std::move(o)));
  };
  return m;
}

}  // namespace tutti::stager
