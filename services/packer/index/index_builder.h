// Builds the packer's index from a directory of WebDataset tar shards,
// reading only tar headers, image/audio headers and the small text members.
#ifndef TUTTI_SERVICES_PACKER_INDEX_INDEX_BUILDER_H_
#define TUTTI_SERVICES_PACKER_INDEX_INDEX_BUILDER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/packer/index/text_tokens.h"

namespace tutti::packer {

inline constexpr uint64_t kDefaultVocabSize = 151936;

struct IndexBuildOptions {
  // Directory holding the .tar shards (searched recursively, sorted by path).
  std::string source_dir;
  // Shards read in parallel. Default 2.
  uint32_t threads = 2;
  // A truncated or corrupt shard (or one with an unsafe member path) is left
  // out and reported (true, the default) or fails the build (false).
  bool skip_bad_shards = true;
  // Bytes per token for k.txt (and JSON "text") estimates. Default 4.
  double bytes_per_token = kDefaultBytesPerToken;
  // Samples whose images exceed these are skipped as "image_too_large" /
  // "aspect_ratio" (defaults match vision.max_source_side/_pixels and
  // vision.max_aspect_ratio of the job config).
  uint32_t max_source_side = 65500;
  uint64_t max_source_pixels = 178956970;
  double max_aspect_ratio = 200.0;
  // Samples with more images than this are skipped as "too_many_images"
  // (the default matches vision.max_images_per_sample's).
  uint32_t max_images_per_sample = 64;
  // A shard with more tar members than this (files, links and special files)
  // is left out as a bad shard naming the limit. Default 1,048,576: a shard
  // of a million members is hundreds of MB of member records while indexed.
  uint64_t max_shard_members = uint64_t{1} << 20;
  // Largest text member read whole (bigger: skipped as "text_too_large").
  // Default 64 MiB.
  uint64_t max_text_bytes = 64ull << 20;
  // Token ids in k.json's input_ids must lie in [0, vocab_size): a sample
  // with an id at or above it is skipped as "token_out_of_vocab", named (an
  // id beyond the model's embedding table fails training, not indexing).
  // Default 151,936, Qwen2-VL's vocabulary, as the job config's default
  // image token ids are Qwen2-VL's; set it to the tokenizer's. 0: [0, 2^31).
  uint64_t vocab_size = kDefaultVocabSize;
};

struct IndexBuildProgress {
  uint32_t shards_done = 0;
  uint32_t shards_total = 0;
  uint64_t samples = 0;
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
};

struct IndexBuildReport {
  uint32_t shards_total = 0;
  uint32_t shards_indexed = 0;
  uint64_t samples = 0;
  uint64_t text_samples = 0;
  uint64_t vl_samples = 0;
  uint64_t images = 0;
  uint64_t audio = 0;
  uint64_t bytes = 0;
  uint64_t ignored_members = 0;               // extensions the index does not use
  std::map<std::string, uint64_t> skipped;    // reason -> samples
  std::map<std::string, uint64_t> skipped_members;  // reason -> tar members not read ("link")
  std::vector<std::string> skipped_examples;  // first few "shard:key: why" (names escaped)
  std::vector<std::string> bad_shards;        // "name: why": unreadable, truncated, corrupt,
                                              // empty, no members, a name that is not UTF-8
  // k.json fields tutti does not know (text_tokens.h): the k.json members
  // that carry any, and per field name the members that carry it (the
  // first 32 names met; the fields met under other names counted in
  // unknown_json_other).
  uint64_t unknown_json_members = 0;
  std::map<std::string, uint64_t> unknown_json_fields;
  uint64_t unknown_json_other = 0;
};

// Lists the .tar shards under dir, relative paths sorted, each as found
// under dir (a symbolic link keeps its own name, not its target's). NOT_FOUND
// when the directory does not exist, FAILED_PRECONDITION when it holds no
// shard. What the stager would refuse to open is left out, each as
// "name: why" in *refused (may be null): a shard or a directory reached
// through a symlink out of dir (a directory so reached is not walked), and
// a .tar that is no regular file (a FIFO, socket or device).
absl::StatusOr<std::vector<std::string>> ListShards(const std::string& dir,
                                                    std::vector<std::string>* refused = nullptr);

// Builds the serialized index. `progress` (may be empty) is called from the
// worker threads, serialized, after every shard. The report is filled in
// even when the build fails (e.g. every shard bad), so the reasons can be shown.
absl::StatusOr<std::string> BuildIndex(
    const IndexBuildOptions& options, IndexBuildReport* report,
    const std::function<void(const IndexBuildProgress&)>& progress);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_INDEX_INDEX_BUILDER_H_
