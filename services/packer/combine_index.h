// A job whose mixture names several index files plans from one index: their
// shards and samples in one, in the order the files are named. Shard names
// become relative to the deepest directory above every file's source
// directory (what the stagers' --source then is), and the index records
// which shards came from which file (Mixture's kCombinedIndexMeta) so that
// each source finds its own. The samples are copied: the combined index
// holds them in memory like an index read whole.
#ifndef TUTTI_SERVICES_PACKER_COMBINE_INDEX_H_
#define TUTTI_SERVICES_PACKER_COMBINE_INDEX_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/packer/index/index.h"
#include "tutti/v1/job.pb.h"

namespace tutti::packer {

// The index files a config draws from: index_path, then every mixture
// source's own, each once.
std::vector<std::string> IndexPathsOf(const v1::JobConfig& config);

// `indexes[i]` was read from `paths[i]`.
absl::StatusOr<std::shared_ptr<const Index>> CombineIndexes(
    const std::vector<std::shared_ptr<const Index>>& indexes,
    const std::vector<std::string>& paths);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_COMBINE_INDEX_H_
