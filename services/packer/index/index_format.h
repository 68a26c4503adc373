// The index file's layout (format version 2), shared by its reader
// (index.cc) and its writer (index_writer.cc). Little-endian throughout.
//
//   header (64 bytes)
//     0  magic "TUTTIIDX"        8  u32 version (2)       12 u32 sections
//     16 u64 file bytes          24 u64 samples            32 u64 media
//     40 u32 shards              44 u32 member extensions
//     48 12 reserved bytes, zero 60 u32 crc32c of bytes 0-59 and the section table
//   section table: `sections` entries of 32 bytes (SectionEntry)
//   sections: each at an 8-byte aligned offset, zero padding between them
//
// Columnar: every per-sample (or per-medium, per-shard) field is a section
// of its own, a flat array the loader maps and points into. A section entry
// says what its rows are (samples, samples + 1, media, shards, or records of
// a size of their own) and each row's size, so a reader checks the size of
// a section it does not know, and its flags say whether such a reader may
// ignore it (an added column: older readers still load the file) or must
// refuse the file (a change in meaning: kRequired). Adding a per-sample
// column is therefore: a new tag, one writer column, one accessor. A change
// an older reader must not misread bumps kIndexVersion instead.
#ifndef TUTTI_SERVICES_PACKER_INDEX_INDEX_FORMAT_H_
#define TUTTI_SERVICES_PACKER_INDEX_INDEX_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace tutti::packer::index_format {

inline constexpr char kMagic[8] = {'T', 'U', 'T', 'T', 'I', 'I', 'D', 'X'};
inline constexpr uint32_t kVersion = 2;
inline constexpr size_t kHeaderBytes = 64;
inline constexpr size_t kHeaderCrcAt = 60;
inline constexpr size_t kSectionEntryBytes = 32;
inline constexpr uint32_t kMaxSections = 256;

constexpr uint32_t Tag(const char (&s)[5]) {
  return uint32_t(uint8_t(s[0])) | uint32_t(uint8_t(s[1])) << 8 | uint32_t(uint8_t(s[2])) << 16 |
         uint32_t(uint8_t(s[3])) << 24;
}
inline std::string TagName(uint32_t tag) {
  std::string s(4, ' ');
  for (int i = 0; i < 4; ++i) {
    const char c = static_cast<char>((tag >> (8 * i)) & 0xFF);
    s[i] = (c >= 0x20 && c < 0x7F) ? c : '?';
  }
  return s;
}

// What a section's rows are.
enum class Rows : uint8_t {
  kBytes = 0,           // a blob (row_bytes 1)
  kRecords = 1,         // records of row_bytes, as many as fit
  kSamples = 2,         // one row per sample
  kSamplesPlusOne = 3,  // offsets: one row per sample and one more
  kMedia = 4,           // one row per image or audio member
  kShards = 5,          // one row per shard
};
inline constexpr uint8_t kMaxRows = 5;

// SectionEntry::flags
inline constexpr uint8_t kRequired = 1;  // a reader that does not know the tag refuses the file

struct SectionEntry {
  uint32_t tag;
  uint32_t crc32c;  // of the section's bytes
  uint64_t offset;
  uint64_t bytes;
  uint8_t rows;  // Rows
  uint8_t flags;
  uint16_t row_bytes;
  uint32_t reserved;  // zero
};
static_assert(sizeof(SectionEntry) == kSectionEntryBytes);

// Sections of version 2 (all required unless noted).
inline constexpr uint32_t kStrs = Tag("STRS");  // bytes: shard names, extensions, reasons
inline constexpr uint32_t kShrd = Tag("SHRD");  // shards: ShardRecord
inline constexpr uint32_t kExts = Tag("EXTS");  // records: StringRecord per extension id
inline constexpr uint32_t kMeta = Tag("META");  // bytes: "key=value\n" lines (C-escaped values)
inline constexpr uint32_t kTref = Tag("TREF");  // samples: u64 text offset | kind << 44 | ext << 48
inline constexpr uint32_t kTsiz = Tag("TSIZ");  // samples: u32 text member bytes
inline constexpr uint32_t kTtok = Tag("TTOK");  // samples: u32 text tokens
inline constexpr uint32_t kKoff = Tag("KOFF");  // samples + 1: u32 key offsets into KEYS
inline constexpr uint32_t kMbeg = Tag("MBEG");  // samples + 1: u32 first medium of each sample
inline constexpr uint32_t kKeys = Tag("KEYS");  // bytes: the keys, back to back
inline constexpr uint32_t kMedi = Tag("MEDI");  // media: Index::MediaRecord
inline constexpr uint32_t kTcrc = Tag("TCRC");  // samples: u32 (optional, with MCRC)
inline constexpr uint32_t kMcrc = Tag("MCRC");  // media: u32 (optional, with TCRC)
// media: u32 each medium's placeholder index in its sample's input_ids
// (placeholders counted); optional, written when some sample's placeholders
// do not all lead (schema 2). Without it every sample's runs lead.
inline constexpr uint32_t kMpos = Tag("MPOS");
inline constexpr uint32_t kTstr = Tag("TSTR");  // records: u32 text-only sample ids, ascending
inline constexpr uint32_t kVstr = Tag("VSTR");  // records: u32 VL sample ids, ascending
inline constexpr uint32_t kSkip = Tag("SKIP");  // records: SkipRecord, by shard then reason
inline constexpr uint32_t kBads = Tag("BADS");  // records: BadShardRecord, by name

struct ShardRecord {
  uint64_t size;
  int64_t mtime_ns;  // modification time when read (0: unknown)
  uint32_t crc32c;
  uint32_t first_sample;
  uint32_t num_samples;
  uint32_t name_off;  // into STRS
  uint32_t name_len;
  uint32_t reserved;  // zero
};
static_assert(sizeof(ShardRecord) == 40);

struct StringRecord {
  uint32_t off;  // into STRS
  uint32_t len;
};
static_assert(sizeof(StringRecord) == 8);

// Samples of one shard skipped for one reason.
struct SkipRecord {
  uint32_t shard;
  uint32_t reason_off;  // into STRS
  uint32_t reason_len;
  uint32_t count;
};
static_assert(sizeof(SkipRecord) == 16);

// A shard that was read and left out (truncated, corrupt, ...): recorded so
// that an incremental build need not read it again while it is unchanged.
struct BadShardRecord {
  uint64_t size;
  int64_t mtime_ns;
  uint32_t name_off;  // into STRS
  uint32_t name_len;
  uint32_t why_off;  // into STRS
  uint32_t why_len;
};
static_assert(sizeof(BadShardRecord) == 32);

}  // namespace tutti::packer::index_format

#endif  // TUTTI_SERVICES_PACKER_INDEX_INDEX_FORMAT_H_
