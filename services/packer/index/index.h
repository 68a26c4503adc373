// The packer's dataset index: for every sample its shard, WebDataset key,
// member offsets, image sizes (from headers) and text token count. Nothing
// here decodes pixels.
//
// On disk and in memory the index is a set of flat arrays (struct of
// arrays, index_format.h), so LoadIndex maps the file and points into it:
// no allocation per sample, and the loaded index costs about
//   36 bytes per sample + key bytes + 20 bytes per image/audio member
// of mapped, shared, evictable file pages (the page cache's, not the heap's),
// plus a few bytes per shard on the heap. Loading checks every byte once
// (section checksums, then every sample's fields).
//
// A wrong magic, another version, a size mismatch or any checksum mismatch is
// refused with a message that names the file and says to rebuild it. The
// file must not be changed in place while it is mapped (`tutti index`
// replaces it with a rename, which leaves a loaded index on the old file).
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

// The format version this tutti writes and reads (index_format.h).
inline constexpr uint32_t kIndexVersion = 2;

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
  std::string name;      // relative to the source directory
  uint64_t size = 0;     // bytes
  int64_t mtime_ns = 0;  // modification time when it was read (0: unknown)
  uint32_t crc32c = 0;   // of the whole file
  uint32_t first_sample = 0;
  uint32_t num_samples = 0;
};

// A shard that was read and left out, and why.
struct IndexBadShard {
  std::string name;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  std::string why;
};

// Samples of a shard skipped for one reason ("bad_image_header", ...).
struct IndexSkip {
  uint32_t shard = 0;
  std::string reason;
  uint32_t count = 0;
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
  // Where its placeholder sits in the sample's input_ids (an index into
  // them, placeholders counted; schema 2), or -1: the sample has none and
  // its runs lead (images in order, then audio clips), as in schema 1.
  // Either every image and audio member of a sample has one or none does.
  int64_t placeholder_at = -1;
};

// A sample's media in the order of its token stream (MediaOrder): one entry
// per image or audio member, sorted by where its run goes.
struct MediaPlace {
  uint32_t media = 0;    // the index's media id
  uint32_t text_at = 0;  // text tokens before its run
  bool image = false;
  uint32_t index = 0;  // position among the sample's images (or audio clips)
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
  // digest of what the plans are made from (its counts, the checksums of
  // its per-sample and per-medium columns, the member extensions, each
  // shard's name, size, checksum and samples). The build metadata (source
  // directory, options), skip counts, bad shards and the shards'
  // modification times do not enter it, nor where the file lies or how its
  // path is spelled. 16 hex digits.
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
  // Whether the index records where each medium's placeholder is (MPOS:
  // written when some sample has placeholders that do not all lead).
  bool has_media_positions() const { return media_pos_ != nullptr; }
  // Medium j's (of sample s) placeholder index in input_ids, placeholders
  // counted; without MPOS (or for a sample without placeholders) the runs
  // lead: image i at i, then audio clip a at images + a.
  uint32_t media_position(uint32_t s, uint32_t j) const;
  // Sample s's media in token-stream order (by placeholder position), each
  // with the text tokens before its run.
  void MediaOrder(uint32_t s, std::vector<MediaPlace>* out) const;

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

  // The two sampling streams, in index order (arrays of the file).
  absl::Span<const uint32_t> text_samples() const { return {text_stream_, num_text_}; }
  absl::Span<const uint32_t> vl_samples() const { return {vl_stream_, num_samples_ - num_text_}; }

  // Free-form build facts (source, builder, options, skip counts), "key=value".
  const std::vector<std::pair<std::string, std::string>>& meta() const { return meta_; }
  // The value of a metadata key ("" when absent).
  std::string meta(absl::string_view key) const;
  // Per shard, the samples skipped and why; the shards read and left out.
  const std::vector<IndexSkip>& skips() const { return skips_; }
  const std::vector<IndexBadShard>& bad_shards() const { return bad_shards_; }

  // Memory: the file's bytes, mapped by LoadIndex (file pages the kernel
  // may share and evict) or held on the heap (FromBuffer/FromString), and
  // what loading allocated on the heap besides: per-shard tables and 4
  // bytes per 256 samples, nothing per sample.
  bool mapped() const { return mapped_; }
  uint64_t file_bytes() const { return size_; }
  uint64_t mapped_bytes() const { return mapped_ ? size_ : 0; }
  uint64_t heap_bytes() const;  // the heap copy of the file, if any, and the tables
  uint64_t memory_bytes() const { return mapped_bytes() + heap_bytes(); }

  // Per-member CRC-32C of the bytes as indexed (an index written from
  // members without checksums has none: has_member_crc32c() false).
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
  friend absl::StatusOr<std::shared_ptr<const Index>> LoadIndex(const std::string& path);
  Index() = default;
  static absl::StatusOr<std::shared_ptr<const Index>> Open(std::shared_ptr<const char> data,
                                                           size_t size, bool mapped,
                                                           std::string origin);
  // Parse's stages, in order.
  absl::Status Parse();
  absl::Status ParseHeader(Layout* layout);
  absl::Status ReadSections(Layout* layout);
  absl::Status CheckPadding(const Layout& layout) const;
  absl::Status BindSections(const Layout& layout);
  absl::Status ReadTables(const Layout& layout);
  void SetContentId(const Layout& layout);
  absl::Status ReadShardTables(const Layout& layout);
  absl::Status Validate();
  absl::Status ValidateSample(uint32_t s, uint64_t shard_size) const;
  absl::Status ValidateStreams() const;
  // The last shard in [lo, hi) starting at or before `sample` (lo - 1 when
  // none does).
  uint32_t SearchShard(uint32_t lo, uint32_t hi, uint32_t sample) const;
  // ShardOf by a search of the whole shard table (before the buckets exist).
  uint32_t ShardOfUnchecked(uint32_t sample) const;

  std::shared_ptr<const char> data_;  // the file's bytes: mapped or on the heap
  size_t size_ = 0;
  bool mapped_ = false;
  std::string origin_;

  uint32_t num_samples_ = 0;
  uint32_t num_media_ = 0;
  uint32_t num_text_ = 0;
  const uint64_t* text_ref_ = nullptr;  // offset | kind << 44 | ext << 48
  const uint32_t* text_size_ = nullptr;
  const uint32_t* text_tokens_ = nullptr;
  const uint32_t* key_off_ = nullptr;      // n+1
  const uint32_t* media_begin_ = nullptr;  // n+1
  const char* keys_ = nullptr;
  uint64_t keys_bytes_ = 0;
  bool keys_ascii_ = false;  // every key byte below 0x80: no key needs a UTF-8 check
  const MediaRecord* media_ = nullptr;
  const uint32_t* text_crc_ = nullptr;   // n, or null
  const uint32_t* media_crc_ = nullptr;  // m, or null
  const uint32_t* media_pos_ = nullptr;  // m, or null (MPOS)
  const uint32_t* text_stream_ = nullptr;
  const uint32_t* vl_stream_ = nullptr;

  std::vector<IndexShard> shards_;
  std::vector<uint32_t> shard_starts_;
  // The shard of sample b << kShardBucketBits, for b up to n's bucket + 1.
  static constexpr uint32_t kShardBucketBits = 8;
  std::vector<uint32_t> shard_bucket_;
  std::vector<std::string> exts_;
  std::vector<std::pair<std::string, std::string>> meta_;
  std::vector<IndexSkip> skips_;
  std::vector<IndexBadShard> bad_shards_;
  std::string source_dir_;
  std::string content_id_;
  uint64_t dataset_bytes_ = 0;
};

// Maps and verifies an index file (a file of another format version is
// refused with a message saying to rebuild it with `tutti index`).
absl::StatusOr<std::shared_ptr<const Index>> LoadIndex(const std::string& path);

class IndexColumn;

// Accumulates shards and samples and serializes them in the index format.
// Not thread-safe; add shards in order, each followed by its samples.
// Columns are kept in memory, or (SpillTo) in unlinked temporary files once
// they grow, so that writing an index of 100 M samples holds megabytes.
class IndexWriter {
 public:
  IndexWriter();
  ~IndexWriter();
  // Keeps column bytes beyond a few MiB in unlinked files under `dir`
  // (call before adding samples; WriteFile then copies them into place).
  absl::Status SpillTo(const std::string& dir);
  void SetSourceDir(std::string dir) { source_dir_ = std::move(dir); }
  void AddMeta(std::string key, std::string value) {
    meta_.emplace_back(std::move(key), std::move(value));
  }
  void Reserve(uint64_t samples, uint64_t media, uint64_t key_bytes);

  // Starts a shard; the samples added next belong to it.
  absl::Status AddShard(const std::string& name, uint64_t size, uint32_t crc32c,
                        int64_t mtime_ns = 0);
  // text may be null (a sample with images or audio only).
  absl::Status AddSample(absl::string_view key, uint32_t text_tokens, const MemberInput* text,
                         absl::Span<const MemberInput> media);
  // Samples of the current shard skipped for `reason`.
  void AddSkipped(absl::string_view reason, uint32_t count);
  // A shard read and left out (kept sorted by name in the file).
  absl::Status AddBadShard(const std::string& name, uint64_t size, int64_t mtime_ns,
                           absl::string_view why);
  // Adds shard `shard` of `from` with its samples and skip counts, as
  // AddShard, AddSample and AddSkipped would (the result is the same bytes).
  absl::Status CopyShard(const Index& from, uint32_t shard);
  // Adds sample `s` of `from` to the current shard with its members as they
  // stand (their checksums where `from` has them), as AddSample would.
  absl::Status CopySample(const Index& from, uint32_t s);

  uint64_t num_samples() const { return num_samples_; }
  // The first error of a spilled column's file (writes are checked here and
  // by WriteFile / Finish).
  absl::Status status() const;
  // Serializes everything added so far.
  std::string Finish() const;
  // Writes it to `path` atomically (temporary file, fsync, rename).
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Section;
  absl::StatusOr<uint16_t> ExtId(absl::string_view ext);
  std::vector<Section> Sections(std::string* strs, std::string* shrd, std::string* exts,
                                std::string* meta, std::string* skip, std::string* bads) const;

  std::string source_dir_;
  std::vector<std::pair<std::string, std::string>> meta_;
  std::vector<IndexShard> shards_;
  std::vector<IndexSkip> skips_;
  std::vector<IndexBadShard> bad_shards_;
  std::vector<std::string> exts_;
  absl::flat_hash_map<std::string, uint16_t> ext_ids_;
  uint64_t num_samples_ = 0;
  uint64_t num_media_ = 0;
  uint64_t key_bytes_ = 0;
  std::unique_ptr<IndexColumn> text_ref_, text_size_, text_tokens_, key_off_, media_begin_, keys_,
      media_, text_crc_, media_crc_, text_stream_, vl_stream_, media_pos_;
  bool member_crcs_ = true;              // every member added so far had a checksum
  bool media_positions_ = false;         // a sample's placeholders did not all lead
  std::vector<MemberInput> copy_media_;  // CopySample's scratch
  std::vector<uint32_t> positions_;      // AddSample's scratch
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_INDEX_INDEX_H_
