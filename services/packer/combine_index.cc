#include "services/packer/combine_index.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "services/packer/core/mixture.h"

namespace tutti::packer {
namespace fs = std::filesystem;

std::vector<std::string> IndexPathsOf(const v1::JobConfig& config) {
  std::vector<std::string> out;
  auto add = [&](const std::string& p) {
    if (!p.empty() && std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  };
  bool default_used = !config.has_mixture();
  for (const v1::MixtureSource& s : config.mixture().sources()) {
    default_used |= s.index_path().empty() || s.index_path() == config.index_path();
  }
  if (default_used) add(config.index_path());
  for (const v1::MixtureSource& s : config.mixture().sources()) add(s.index_path());
  return out;
}

absl::StatusOr<std::shared_ptr<const Index>> CombineIndexes(
    const std::vector<std::shared_ptr<const Index>>& indexes,
    const std::vector<std::string>& paths) {
  // The deepest directory above every source directory.
  fs::path root;
  for (size_t i = 0; i < indexes.size(); ++i) {
    const fs::path dir = fs::path(indexes[i]->source_dir()).lexically_normal();
    if (i == 0) {
      root = dir;
      continue;
    }
    fs::path common;
    auto a = root.begin(), b = dir.begin();
    for (; a != root.end() && b != dir.end() && *a == *b; ++a, ++b) common /= *a;
    root = common;
  }
  IndexWriter w;
  w.SetSourceDir(root.generic_string());
  w.AddMeta("builder", "tutti-packerd (combined from the mixture's index files)");
  uint64_t samples = 0, media = 0, keys = 0;
  for (const auto& ix : indexes) {
    samples += ix->num_samples();
    media += ix->num_media();
    keys += uint64_t{ix->num_samples()} * 12;
  }
  if (samples >= UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("the mixture's index files hold ", samples,
                     " samples together, more than one index holds "
                     "(2^32 - 1); draw from fewer or smaller indexes"));
  }
  w.Reserve(samples, media, keys);
  uint32_t first_shard = 0;
  for (size_t i = 0; i < indexes.size(); ++i) {
    const Index& ix = *indexes[i];
    std::string prefix =
        fs::path(ix.source_dir()).lexically_normal().lexically_relative(root).generic_string();
    if (prefix == "." || prefix.empty()) {
      prefix.clear();
    } else {
      prefix += "/";
    }
    w.AddMeta(kCombinedIndexMeta,
              absl::StrCat(paths[i], "\t", first_shard, "\t", ix.num_shards(), "\t", prefix));
    for (uint32_t sh = 0; sh < ix.num_shards(); ++sh) {
      const IndexShard& shard = ix.shard(sh);
      RETURN_IF_ERROR(w.AddShard(prefix + shard.name, shard.size, shard.crc32c));
      for (uint32_t s = shard.first_sample; s < shard.first_sample + shard.num_samples; ++s) {
        RETURN_IF_ERROR(w.CopySample(ix, s));
      }
    }
    first_shard += ix.num_shards();
  }
  return Index::FromString(w.Finish(), absl::StrCat("combined(", paths.size(), " indexes)"));
}

}  // namespace tutti::packer
