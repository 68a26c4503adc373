// The packer's dataset index: for every sample its shard, WebDataset key,
// member offsets, image sizes (from headers) and text token count. Nothing
// here decodes pixels.
//
// In memory and on disk the index is a set of flat arrays (struct of arrays)
// in one buffer, so loading is one read plus checksums and costs about
//   28 bytes per sample + key bytes + 16 bytes per image/audio member
// (≈ 45 bytes per sample for 80% text-only, 20% 1-4 images, 9-byte keys).
//
// File format (version 1), little-endian:
//   header (64 bytes): magic "TUTTIIDX", version, header/table sizes, counts,
//                      crc32c of header+section table
//   section table:     per section {tag, crc32c, offset, bytes}
//   sections:          8-byte aligned arrays, each with its own crc32c
// A wrong magic, another version, a size mismatch or any checksum mismatch is
// refused with a message that names the file and says to rebuild it.
#ifndef TUTTI_SERVICES_PACKER_INDEX_INDEX_H_
#define TUTTI_SERVICES_PACKER_INDEX_INDEX_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tutti::packer {

inline constexpr uint32_t kIndexVersion = 1;

// What a member holds. Image kinds come from the magic bytes, not the name.
enum class MemberKind : uint8_t {
  kNone = 0,
  kJpeg = 1,
  kPng = 2,
  kWebp = 3,
  kWav = 4,
  kJson = 5,
  kTxt = 6,
};
inline bool IsImage(MemberKind k) {
  return k == MemberKind::kJpeg || k == MemberKind::kPng || k == MemberKind::kWebp;
}
absl::string_view MemberKindName(MemberKind k);

struct IndexShard {
  std::string name;     // relative to the source directory
  uint64_t size = 0;    // bytes
  uint32_t crc32c = 0;  // of the whole file
  uint32_t first_sample = 0;
  uint32_t num_samples = 0;
};

// One image or audio member of a sample.
struct MediaView {
  MemberKind kind = MemberKind::kNone;
  uint16_t ext = 0;     // id into Index::ext(); member name = key + "." + ext
  uint64_t offset = 0;  // data offset in the shard
  uint32_t size = 0;
  uint32_t width = 0;  // images
  uint32_t height = 0;
  uint32_t audio_ms = 0;  // audio
};

// A member as the writer receives it.
struct MemberInput {
  MemberKind kind = MemberKind::kNone;
  std::string ext;  // e.g. "json", "0.jpg"
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t width = 0;
  uint32_t height = 0;
  uint32_t audio_ms = 0;
  // CRC-32C of the member's bytes; an index records member checksums only
  // when every member has one.
  bool has_crc32c = false;
  uint32_t crc32c = 0;
};

class Index {
 public:
  // Parses and verifies a serialized index held in `data` (size bytes).
  // `origin` names it in errors (a path).
  static absl::StatusOr<std::shared_ptr<const Index>> FromBuffer(std::unique_ptr<char[]> data,
                                                                 size_t size, std::string origin);
  static absl::StatusOr<std::shared_ptr<const Index>> FromString(const std::string& bytes,
                                                                 std::string origin);

  uint32_t num_samples() const { return num_samples_; }
  uint32_t num_media() const { return num_media_; }
  uint32_t num_shards() const { return static_cast<uint32_t>(shards_.size()); }
  const IndexShard& shard(uint32_t i) const { return shards_[i]; }
  const std::vector<IndexShard>& shards() const { return shards_; }
  uint64_t dataset_bytes() const { return dataset_bytes_; }
  const std::string& source_dir() const { return source_dir_; }
  const std::string& origin() const { return origin_; }
  // The identity of what the index holds, for the job's fingerprint: a
  // digest of its format version, its counts and the checksums of every
  // section but the build metadata (source directory, builder, skip
  // counts). Where the file lies and how its path is spelled do not enter
  // it, nor where the shards were indexed from. 16 hex digits.
  const std::string& content_id() const { return content_id_; }

  // The shard holding a sample (a binary search over the shard starts of
  // the sample's bucket of 1 << kShardBucketBits samples).
  uint32_t ShardOf(uint32_t sample) const;

  absl::string_view key(uint32_t s) const {
    return absl::string_view(keys_ + key_off_[s], key_off_[s + 1] - key_off_[s]);
  }
  uint32_t text_tokens(uint32_t s) const { return text_tokens_[s]; }
  MemberKind text_kind(uint32_t s) const {
    return static_cast<MemberKind>((text_ref_[s] >> 44) & 0xF);
  }
  uint16_t text_ext(uint32_t s) const { return static_cast<uint16_t>(text_ref_[s] >> 48); }
  uint64_t text_offset(uint32_t s) const { return text_ref_[s] & kOffsetMask; }
  uint32_t text_size(uint32_t s) const { return text_size_[s]; }

  uint32_t media_begin(uint32_t s) const { return media_begin_[s]; }
  uint32_t media_end(uint32_t s) const { return media_begin_[s + 1]; }
  MediaView media(uint32_t j) const;
  // Image width/height without building a MediaView (hot path).
  bool media_is_image(uint32_t j) const {
    return IsImage(static_cast<MemberKind>((media_[j].ref >> 44) & 0xF));
  }
  uint32_t media_width(uint32_t j) const { return media_[j].dims & 0xFFFF; }
  uint32_t media_height(uint32_t j) const { return media_[j].dims >> 16; }
  uint32_t media_audio_ms(uint32_t j) const { return media_[j].dims; }

  // Hints for batched random access (planning draws samples at random).
  void PrefetchSample(uint32_t s) const {
    __builtin_prefetch(text_tokens_ + s);
    __builtin_prefetch(media_begin_ + s);
  }
  void PrefetchMedia(uint32_t s) const { __builtin_prefetch(media_ + media_begin_[s]); }

  // A VL sample has at least one image or audio member.
  bool is_vl(uint32_t s) const { return media_begin_[s + 1] > media_begin_[s]; }
  absl::string_view ext(uint16_t id) const { return exts_[id]; }
  uint32_t num_exts() const { return static_cast<uint32_t>(exts_.size()); }

  // The two sampling streams, in index order.
  const std::vector<uint32_t>& text_samples() const { return text_samples_; }
  const std::vector<uint32_t>& vl_samples() const { return vl_samples_; }

  // Free-form build facts (source, builder, skip counts), "key=value".
  const std::vector<std::pair<std::string, std::string>>& meta() const { return meta_; }

  // Bytes held in memory by this index (buffer + derived arrays).
  uint64_t memory_bytes() const;

  // Per-member CRC-32C of the bytes as indexed (indexes built before member
  // checksums have none: has_member_crc32c() false).
  bool has_member_crc32c() const { return text_crc_ != nullptr; }
  uint32_t text_crc32c(uint32_t s) const { return text_crc_[s]; }
  uint32_t media_crc32c(uint32_t j) const { return media_crc_[j]; }

  // Member name of a sample's member: key + "." + ext.
  std::string MemberName(uint32_t s, uint16_t ext) const;

  static constexpr uint64_t kOffsetMask = (uint64_t{1} << 44) - 1;
  struct MediaRecord {
    uint64_t ref;  // offset (44 bits) | kind (4 bits) | ext id (16 bits)
    uint32_t size;
    uint32_t dims;  // images: width | height << 16; audio: duration ms
  };
  static_assert(sizeof(MediaRecord) == 16);

 private:
  struct Layout;
  Index() = default;
  // Parse's stages, in order.
  absl::Status Parse();
  absl::Status ParseHeader(Layout* layout);
  absl::Status ReadSections(Layout* layout);
  absl::Status CheckPadding(const Layout& layout) const;
  absl::Status BindSections(const Layout& layout);
  // The last shard in [lo, hi) starting at or before `sample` (lo - 1 when
  // none does).
  uint32_t SearchShard(uint32_t lo, uint32_t hi, uint32_t sample) const;
  absl::Status ReadTables(const Layout& layout);
  absl::Status Validate();

  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
  std::string origin_;

  uint32_t num_samples_ = 0;
  uint32_t num_media_ = 0;
  const uint64_t* text_ref_ = nullptr;  // offset | kind << 44 | ext << 48
  const uint32_t* text_size_ = nullptr;
  const uint32_t* text_tokens_ = nullptr;
  const uint32_t* key_off_ = nullptr;      // n+1
  const uint32_t* media_begin_ = nullptr;  // n+1
  const char* keys_ = nullptr;
  uint64_t keys_bytes_ = 0;
  const MediaRecord* media_ = nullptr;
  const uint32_t* text_crc_ = nullptr;   // n, or null
  const uint32_t* media_crc_ = nullptr;  // m, or null

  std::vector<IndexShard> shards_;
  std::vector<uint32_t> shard_starts_;
  // The shard of sample b << kShardBucketBits, for b up to n's bucket + 1.
  static constexpr uint32_t kShardBucketBits = 8;
  std::vector<uint32_t> shard_bucket_;
  std::vector<std::string> exts_;
  std::vector<std::pair<std::string, std::string>> meta_;
  std::string source_dir_;
  std::string content_id_;
  uint64_t dataset_bytes_ = 0;
  std::vector<uint32_t> text_samples_;
  std::vector<uint32_t> vl_samples_;
};

// Reads and verifies an index file.
absl::StatusOr<std::shared_ptr<const Index>> LoadIndex(const std::string& path);

// Accumulates shards and samples and serializes them in the index format.
// Not thread-safe; add shards in order, each followed by its samples.
class IndexWriter {
 public:
  IndexWriter();
  void SetSourceDir(std::string dir) { source_dir_ = std::move(dir); }
  void AddMeta(std::string key, std::string value) {
    meta_.emplace_back(std::move(key), std::move(value));
  }
  void Reserve(uint64_t samples, uint64_t media, uint64_t key_bytes);

  // Starts a shard; the samples added next belong to it.
  absl::Status AddShard(const std::string& name, uint64_t size, uint32_t crc32c);
  // text may be null (a sample with images or audio only).
  absl::Status AddSample(absl::string_view key, uint32_t text_tokens, const MemberInput* text,
                         absl::Span<const MemberInput> media);

  uint64_t num_samples() const { return text_tokens_.size(); }
  // Serializes everything added so far.
  std::string Finish() const;

 private:
  absl::StatusOr<uint16_t> ExtId(absl::string_view ext);

  std::string source_dir_;
  std::vector<std::pair<std::string, std::string>> meta_;
  std::vector<IndexShard> shards_;
  std::vector<std::string> exts_;
  absl::flat_hash_map<std::string, uint16_t> ext_ids_;
  std::vector<uint64_t> text_ref_;
  std::vector<uint32_t> text_size_;
  std::vector<uint32_t> text_tokens_;
  std::vector<uint32_t> key_off_;
  std::vector<uint32_t> media_begin_;
  std::string keys_;
  std::vector<Index::MediaRecord> media_;
  std::vector<uint32_t> text_crc_;
  std::vector<uint32_t> media_crc_;
  bool member_crcs_ = true;  // every member added so far had a checksum
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_INDEX_INDEX_H_
