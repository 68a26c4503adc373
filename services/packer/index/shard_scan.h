// One shard's part of the index: its tar members grouped into samples, the
// image and audio headers and text token counts of their members, and the
// CRC-32C of the shard and of every member, with what was skipped and why.
// The scanner reads through any RandomAccessFile: a ReadAheadFile (the
// shard read once, front to back, many reads in flight) or a file that
// reads each header where it lies (one read at a time).
#ifndef TUTTI_SERVICES_PACKER_INDEX_SHARD_SCAN_H_
#define TUTTI_SERVICES_PACKER_INDEX_SHARD_SCAN_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/file_io.h"
#include "common/sample_json.h"
#include "services/packer/index/index.h"
#include "services/packer/index/index_builder.h"

namespace tutti::packer {

struct SampleOut {
  std::string key;
  uint32_t text_tokens = 0;
  bool has_text = false;
  MemberInput text;
  std::vector<MemberInput> media;
};

struct ShardResult {
  absl::Status status;  // not OK: a bad shard, left out
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint32_t crc32c = 0;
  std::vector<SampleOut> samples;
  std::map<std::string, uint64_t> skipped;
  std::map<std::string, uint64_t> skipped_members;
  std::vector<std::string> examples;
  uint64_t ignored = 0;
  // k.json fields tutti does not know: members carrying any, and per name.
  uint64_t unknown_json_members = 0;
  std::map<std::string, uint64_t> unknown_json_fields;  // at most 32 names
  uint64_t unknown_json_other = 0;
};

// CRC-32C of a file and of byte ranges of it (members), from the file's
// bytes fed in order. Ranges are added in ascending order of offset, each
// before any of its bytes is fed.
class ShardChecksums {
 public:
  // Returns the range's id.
  uint32_t Add(uint64_t offset, uint64_t size);
  void Feed(uint64_t offset, absl::string_view bytes);
  uint32_t file_crc32c() const { return file_; }
  uint32_t crc32c(uint32_t id) const { return ranges_[id].crc; }

 private:
  struct Range {
    uint64_t offset, size;
    uint32_t crc;
  };
  std::vector<Range> ranges_;
  size_t first_ = 0;  // ranges before it are done
  uint32_t file_ = 0;
};

// Reads the whole of `file` in 4 MiB reads into `sums` (the checksum pass
// of a reader that does not stream the shard).
absl::Status ChecksumPass(const RandomAccessFile& file, ShardChecksums* sums);

class ShardScanner {
 public:
  // `rel` names the shard (relative to the source) in examples and errors.
  ShardScanner(const IndexBuildOptions& options, const std::string& rel) : o_(options), rel_(rel) {}

  // Scans `file`. The members' checksums are added to `sums` as the walk
  // finds them; `finish` then feeds the rest of the file to `sums` (a
  // ReadAheadFile whose consume feeds `sums`: its Drain; otherwise a
  // ChecksumPass).
  ShardResult Scan(const RandomAccessFile& file, ShardChecksums* sums,
                   const std::function<absl::Status()>& finish);

 private:
  struct Member;
  struct Group;
  void Probe(const RandomAccessFile& f, Member* m);
  void Skip(ShardResult* r, const std::string& key, const std::string& reason,
            const std::string& detail);
  void ScanSample(Group* g, const ShardChecksums& sums, ShardResult* r);

  const IndexBuildOptions& o_;
  const std::string& rel_;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_INDEX_SHARD_SCAN_H_
