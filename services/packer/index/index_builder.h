// Builds the packer's index from a directory of WebDataset tar shards,
// reading only tar headers, image/audio headers and the small text members
// for the index's fields, and every byte once for the shard and member
// checksums. Shards are read in parallel, each front to back in large reads
// with several in flight (io_uring, or a thread pool of pread), so a network
// file system's latency is paid once per read of a MiB, not once per tar
// header. A previous index of the same source lets the build reuse what it
// recorded of every shard that did not change (same size and modification
// time) and read only the new and changed ones; the result is the same bytes
// a full build writes.
#ifndef TUTTI_SERVICES_PACKER_INDEX_INDEX_BUILDER_H_
#define TUTTI_SERVICES_PACKER_INDEX_INDEX_BUILDER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/uring_file.h"
#include "services/packer/index/index.h"
#include "services/packer/index/text_tokens.h"

namespace tutti::packer {

inline constexpr uint64_t kDefaultVocabSize = 151936;

// The CPUs this process may use (common/cpu_count.h), at least 2, at most 8.
uint32_t DefaultIndexThreads();

// How shards are read.
enum class ShardReader {
  // Each shard front to back in read_bytes reads, io_depth of them in
  // flight, served to the tar walk from that window (the default).
  kReadAhead,
  // Each tar header, image header and text member read where it lies, one
  // read at a time, then the whole shard again for its checksums: the
  // reader `tutti bench index` compares against.
  kPerHeader,
};

struct IndexBuildOptions {
  // Directory holding the .tar shards (searched recursively, sorted by path).
  std::string source_dir;
  // Shards read at once. Default: the CPUs this process may use, 2 to 8
  // (DefaultIndexThreads); with io_depth reads each, 16 to 64 in flight.
  uint32_t threads = DefaultIndexThreads();
  ShardReader reader = ShardReader::kReadAhead;
  // Reads in flight per shard (kReadAhead). Default 8.
  uint32_t io_depth = 8;
  // Bytes per read (kReadAhead; a multiple of 4 KiB). Default 1 MiB.
  uint64_t read_bytes = uint64_t{1} << 20;
  // io_uring, the pread thread pool, or io_uring where the kernel allows
  // it (default).
  IoBackendChoice io_backend = IoBackendChoice::kAuto;
  // A read or open not done by then fails its shard. Default 5 minutes.
  absl::Duration read_timeout = absl::Minutes(5);
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
  // The placeholder ids of schema-2 k.json documents (one per image / audio
  // clip at its place). A schema-2 sample whose placeholders differ in number
  // from its image or audio members, or a schema-1 sample holding one in its
  // text, is skipped as "placeholder_mismatch", named. -1 (default): none
  // known (`tutti index` takes them from the dataset's tutti_dataset.json).
  int64_t image_placeholder_id = -1;
  int64_t audio_placeholder_id = -1;
  // The index built last time (null: read every shard). Used when it indexed
  // the same source directory with the same options above; what it recorded
  // of a shard whose size and modification time are unchanged is taken as
  // it is (as rsync's quick check: a shard rewritten in place to the same
  // size and time is not noticed; build without `previous` to read all).
  std::shared_ptr<const Index> previous;
  // With `previous`: only add shards. Every shard it recorded must be there
  // unchanged and every new shard must sort after them, so that every
  // sample keeps its id; otherwise the build fails naming the shard.
  bool append = false;
};

struct IndexBuildProgress {
  uint32_t shards_done = 0;  // read, reused from the previous index, or left out
  uint32_t shards_total = 0;
  uint64_t samples = 0;     // indexed so far (reused ones included)
  uint64_t bytes_done = 0;  // of the shards to read
  uint64_t bytes_total = 0;
};

struct IndexBuildReport {
  uint32_t shards_total = 0;
  uint32_t shards_indexed = 0;
  uint32_t shards_read = 0;     // read this time (the rest came from the previous index)
  uint32_t shards_reused = 0;   // unchanged since the previous index, not read
  uint32_t shards_removed = 0;  // in the previous index, gone from the source
  std::string not_incremental;  // why the previous index was not used ("" when it was)
  uint64_t samples = 0;
  uint64_t text_samples = 0;
  uint64_t vl_samples = 0;
  uint64_t images = 0;
  uint64_t audio = 0;
  uint64_t bytes = 0;
  uint64_t bytes_read = 0;
  uint64_t ignored_members = 0;                     // extensions the index does not use
  std::map<std::string, uint64_t> skipped;          // reason -> samples
  std::map<std::string, uint64_t> skipped_members;  // reason -> tar members not read ("link")
  std::vector<std::string> skipped_examples;        // first few "shard:key: why" (names escaped)
  std::vector<std::string> bad_shards;              // "name: why": unreadable, truncated, corrupt,
                                                    // empty, no members, a name that is not UTF-8
  // k.json fields tutti does not know (text_tokens.h) in the shards read
  // this time: the k.json members that carry any, and per field name the
  // members that carry it (the first 32 names met; the fields met under
  // other names counted in unknown_json_other).
  uint64_t unknown_json_members = 0;
  std::map<std::string, uint64_t> unknown_json_fields;
  uint64_t unknown_json_other = 0;
};

// A shard as listed: its name under the source, size and modification time.
struct ListedShard {
  std::string name;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
};

// Lists the .tar shards under dir, relative paths sorted, each as found
// under dir (a symbolic link keeps its own name, not its target's). NOT_FOUND
// when the directory does not exist, FAILED_PRECONDITION when it holds no
// shard. What the stager would refuse to open is left out, each as
// "name: why" in *refused (may be null): a shard or a directory reached
// through a symlink out of dir (a directory so reached is not walked), and
// a .tar that is no regular file (a FIFO, socket or device).
absl::StatusOr<std::vector<ListedShard>> ListShards(const std::string& dir,
                                                    std::vector<std::string>* refused = nullptr);

// Builds the serialized index. `progress` (may be empty) is called from the
// worker threads, serialized, after every shard. The report is filled in
// even when the build fails (e.g. every shard bad), so the reasons can be shown.
absl::StatusOr<std::string> BuildIndex(
    const IndexBuildOptions& options, IndexBuildReport* report,
    const std::function<void(const IndexBuildProgress&)>& progress);

// Builds the index into the file `out` (replaced atomically), holding
// megabytes however many samples (the columns go through temporary files
// beside `out`).
absl::Status BuildIndexFile(const IndexBuildOptions& options, const std::string& out,
                            IndexBuildReport* report,
                            const std::function<void(const IndexBuildProgress&)>& progress);

// The "options" metadata an index records of the options that shape it
// (two builds with the same string index alike).
std::string IndexOptionsMeta(const IndexBuildOptions& options);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_INDEX_INDEX_BUILDER_H_
