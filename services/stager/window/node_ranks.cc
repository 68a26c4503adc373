#include "services/stager/window/node_ranks.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace tutti::stager {
namespace {
const Logger kLog("stager.node");
}  // namespace

absl::StatusOr<NodeRanks> NodeRanks::Make(std::optional<uint32_t> node, uint32_t ranks_per_node,
                                          uint32_t world_size) {
  if (ranks_per_node == 0 || world_size == 0 || world_size % ranks_per_node != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job's world_size ", world_size, " is not a positive multiple of ranks_per_node ",
        ranks_per_node));
  }
  NodeRanks r(ranks_per_node, world_size, !node.has_value());
  if (node.has_value()) {
    const uint32_t nodes = world_size / ranks_per_node;
    if (*node >= nodes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--node ", *node, " does not exist: the job has ", nodes, " nodes (world_size ",
          world_size, " / ranks_per_node ", ranks_per_node, "); use --node 0..", nodes - 1,
          " or --node=auto"));
    }
    r.node_ = *node;
    r.known_ = true;
  }
  return r;
}

std::vector<uint32_t> NodeRanks::ranks() const {
  std::vector<uint32_t> out;
  if (!known_) return out;
  for (uint32_t i = 0; i < per_node_; ++i) out.push_back(first() + i);
  return out;
}

absl::Status NodeRanks::Learn(uint32_t rank) {
  if (known_) return absl::OkStatus();
  if (rank >= world_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not in the job (world size ", world_, ")"));
  }
  node_ = rank / per_node_;
  learned_from_ = rank;
  known_ = true;
  kLog.Info("--node=auto: learned this node from the first client",
            {{"rank", rank}, {"node", node_}, {"first_rank", first()},
             {"last_rank", first() + per_node_ - 1}});
  return absl::OkStatus();
}

absl::Status NodeRanks::CheckLocal(uint32_t rank) const {
  if (IsLocal(rank)) return absl::OkStatus();
  const uint32_t theirs = rank / per_node_;
  return absl::InvalidArgumentError(absl::StrCat(
      "rank ", rank, " belongs to node ", theirs, " but this tutti-stagerd serves node ", node_,
      " (ranks ", first(), "..", first() + per_node_ - 1,
      learn_
          ? absl::StrCat("; learned from rank ", learned_from_, "'s first call under --node=auto")
          : std::string(),
      "); ask the stager of node ", theirs));
}

}  // namespace tutti::stager
