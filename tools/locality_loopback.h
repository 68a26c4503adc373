// `tutti bench locality --loopback`: shard homes measured on real stagers.
// A small dataset generated in the seed's mix (tutti gen-dataset's code),
// indexed (tutti index's), one tutti-packerd (PackerServer, in process,
// gRPC on 127.0.0.1) and `nodes` tutti-stagerd (StagerServer, in process,
// each its own cache directory, --node=auto, every other one named in
// --peers over a Unix socket), `nodes` x `ranks_per_node` ranks taking and
// releasing every batch of one epoch, once per replication (0: locality
// off). From the stagers' own counters: the bytes each read from the source
// (tutti_stager_source_bytes_total) over the dataset's bytes, the member
// bytes moved stager to stager (tutti_stager_peer_bytes_total) per step,
// the members received from holders and those read from the source after a
// holder failed; from the job's planner (the plans the packer served, as
// planning is deterministic): the ViT phase's slowest rank over its lower
// bound.
#ifndef TUTTI_TOOLS_LOCALITY_LOOPBACK_H_
#define TUTTI_TOOLS_LOCALITY_LOOPBACK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tutti::tools {

struct LoopbackOptions {
  std::string dir;                  // work directory (required; emptied first)
  uint64_t samples = 256;           // generated samples
  uint32_t samples_per_shard = 16;  // 16 shards of the default 256 samples
  uint32_t nodes = 4;
  uint32_t ranks_per_node = 2;
  std::vector<uint32_t> replications = {0, 1, 2};  // home_replication; 0: locality off
  bool post_balancing = true;
  uint32_t decode_threads = 1;                       // per stager
  std::function<void(const std::string&)> progress;  // may be empty
};

struct LoopbackRun {
  uint32_t replication = 0;  // 0: locality off
  uint64_t steps = 0, batches = 0, skipped = 0;
  double dataset_bytes = 0;  // the shards' bytes
  double source_bytes = 0;   // summed over the stagers
  double peer_sent_bytes = 0, peer_received_bytes = 0;
  double peer_received_members = 0, peer_fallback_members = 0;
  double vit_over_bound_mean = 0, vit_over_bound_max = 0;
  double seconds = 0;
};

absl::StatusOr<std::vector<LoopbackRun>> RunLocalityLoopback(const LoopbackOptions& options);
std::string FormatLoopbackTable(const LoopbackOptions& options,
                                const std::vector<LoopbackRun>& runs);
std::string FormatLoopbackJson(const std::vector<LoopbackRun>& runs);

}  // namespace tutti::tools

#endif  // TUTTI_TOOLS_LOCALITY_LOOPBACK_H_
