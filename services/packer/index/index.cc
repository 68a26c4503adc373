// Index: maps (or takes) an index file and verifies every byte of it
// (index_format.h) before pointing into it.
#include "services/packer/index/index.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <functional>
#include <thread>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "common/status.h"
#include "common/tar.h"
#include "services/packer/index/index_format.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the index format is little-endian");

namespace tutti::packer {

namespace fmt = index_format;

namespace {

template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

absl::Status Damaged(const std::string& origin, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("index ", origin, " is damaged: ", what,
                                          "; rebuild it with `tutti index --source DIR --out ",
                                          origin, "`"));
}

// The sections this version reads: rows, row size, and whether a file
// without it is refused (the member checksums are optional).
struct Known {
  uint32_t tag;
  fmt::Rows rows;
  uint16_t row_bytes;
  bool needed;
};
constexpr Known kKnown[] = {
    {fmt::kStrs, fmt::Rows::kBytes, 1, true},
    {fmt::kShrd, fmt::Rows::kShards, sizeof(fmt::ShardRecord), true},
    {fmt::kExts, fmt::Rows::kRecords, sizeof(fmt::StringRecord), true},
    {fmt::kMeta, fmt::Rows::kBytes, 1, true},
    {fmt::kSkip, fmt::Rows::kRecords, sizeof(fmt::SkipRecord), true},
    {fmt::kBads, fmt::Rows::kRecords, sizeof(fmt::BadShardRecord), true},
    {fmt::kTref, fmt::Rows::kSamples, 8, true},
    {fmt::kTsiz, fmt::Rows::kSamples, 4, true},
    {fmt::kTtok, fmt::Rows::kSamples, 4, true},
    {fmt::kKoff, fmt::Rows::kSamplesPlusOne, 4, true},
    {fmt::kMbeg, fmt::Rows::kSamplesPlusOne, 4, true},
    {fmt::kKeys, fmt::Rows::kBytes, 1, true},
    {fmt::kMedi, fmt::Rows::kMedia, sizeof(Index::MediaRecord), true},
    {fmt::kTstr, fmt::Rows::kRecords, 4, true},
    {fmt::kVstr, fmt::Rows::kRecords, 4, true},
    {fmt::kTcrc, fmt::Rows::kSamples, 4, false},
    {fmt::kMcrc, fmt::Rows::kMedia, 4, false},
    {fmt::kMpos, fmt::Rows::kMedia, 4, false},
};

// Runs fn over [0, n) in ranges on up to 16 threads (one range when n is
// small); the error of the lowest range that failed, so the error names
// what a loop from 0 would have met first.
absl::Status InRanges(uint64_t n, const std::function<absl::Status(uint64_t, uint64_t)>& fn) {
  constexpr uint64_t kMinPerRange = uint64_t{1} << 20;
  const uint64_t cores = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t ranges = std::clamp<uint64_t>(n / kMinPerRange, 1, std::min<uint64_t>(cores, 16));
  if (ranges == 1) return fn(0, n);
  std::vector<absl::Status> status(ranges);
  std::vector<std::thread> threads;
  for (uint64_t r = 0; r < ranges; ++r) {
    threads.emplace_back([&, r] { status[r] = fn(n * r / ranges, n * (r + 1) / ranges); });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

// The CRC-32C of n bytes, large ones in pieces on several threads.
uint32_t SectionCrc(const char* p, uint64_t n) {
  constexpr uint64_t kPiece = uint64_t{16} << 20;
  const uint64_t pieces = (n + kPiece - 1) / kPiece;
  if (pieces <= 1) return Crc32cExtend(0, p, n);
  std::vector<uint32_t> crcs(pieces);
  (void)InRanges(pieces * (uint64_t{1} << 20), [&](uint64_t b, uint64_t e) {
    for (uint64_t i = b >> 20; i < (e >> 20); ++i) {
      crcs[i] = Crc32cExtend(0, p + i * kPiece, std::min(kPiece, n - i * kPiece));
    }
    return absl::OkStatus();
  });
  uint32_t crc = crcs[0];
  for (uint64_t i = 1; i < pieces; ++i) {
    crc = Crc32cCombine(crc, crcs[i], std::min(kPiece, n - i * kPiece));
  }
  return crc;
}

// Whether every byte is below 0x80 (then every string cut from them is UTF-8).
bool AllAscii(const char* p, uint64_t n) {
  uint64_t acc = 0;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    acc |= w;
  }
  for (; i < n; ++i) acc |= static_cast<unsigned char>(p[i]);
  return (acc & 0x8080808080808080ull) == 0;
}

const Known* FindKnown(uint32_t tag) {
  for (const Known& k : kKnown) {
    if (k.tag == tag) return &k;
  }
  return nullptr;
}

}  // namespace

absl::string_view MemberKindName(MemberKind k) {
  switch (k) {
    case MemberKind::kJpeg:
      return "jpeg";
    case MemberKind::kPng:
      return "png";
    case MemberKind::kWebp:
      return "webp";
    case MemberKind::kWav:
      return "wav";
    case MemberKind::kJson:
      return "json";
    case MemberKind::kTxt:
      return "txt";
    default:
      return "none";
  }
}

// Where the file's parts lie, found by ParseHeader and ReadSections.
struct Index::Layout {
  struct Section {
    const char* data;
    uint64_t bytes;
    uint32_t crc32c = 0;
  };
  uint32_t num_sections = 0;
  size_t table_end = 0;  // header and section table
  uint64_t samples = 0;
  uint64_t media = 0;
  uint32_t num_shards = 0;
  uint32_t num_exts = 0;
  absl::flat_hash_map<uint32_t, Section> sections;  // tag -> bytes (every section of the file)
  const Section* Find(uint32_t tag) const {
    auto it = sections.find(tag);
    return it == sections.end() ? nullptr : &it->second;
  }
};

absl::StatusOr<std::shared_ptr<const Index>> Index::Open(std::shared_ptr<const char> data,
                                                         size_t size, bool mapped,
                                                         std::string origin) {
  std::shared_ptr<Index> index(new Index());
  index->data_ = std::move(data);
  index->size_ = size;
  index->mapped_ = mapped;
  index->origin_ = std::move(origin);
  RETURN_IF_ERROR(index->Parse());
  RETURN_IF_ERROR(index->Validate());
  return std::shared_ptr<const Index>(std::move(index));
}

absl::StatusOr<std::shared_ptr<const Index>> Index::FromBuffer(std::unique_ptr<char[]> data,
                                                               size_t size, std::string origin) {
  std::shared_ptr<const char> owned(data.release(), std::default_delete<char[]>());
  return Open(std::move(owned), size, /*mapped=*/false, std::move(origin));
}

absl::StatusOr<std::shared_ptr<const Index>> Index::FromString(const std::string& bytes,
                                                               std::string origin) {
  std::unique_ptr<char[]> data(new char[std::max<size_t>(bytes.size(), 1)]);
  std::memcpy(data.get(), bytes.data(), bytes.size());
  return FromBuffer(std::move(data), bytes.size(), std::move(origin));
}

absl::Status Index::Parse() {
  Layout layout;
  RETURN_IF_ERROR(ParseHeader(&layout));
  RETURN_IF_ERROR(ReadSections(&layout));
  RETURN_IF_ERROR(CheckPadding(layout));
  RETURN_IF_ERROR(BindSections(layout));
  RETURN_IF_ERROR(ReadTables(layout));
  SetContentId(layout);
  return absl::OkStatus();
}

// What determines the plans made from the index: the counts, the
// per-sample and per-medium columns (by their checksums), the stream lists,
// the member extensions and each shard's name, size, checksum and samples.
// Left out: the build metadata (source directory, options), the skip
// counts and bad shards, and the shards' modification times.
void Index::SetContentId(const Layout& layout) {
  std::string bytes(data_.get() + 24, 24);  // samples, media, shards, extensions
  for (const uint32_t tag : {fmt::kTref, fmt::kTsiz, fmt::kTtok, fmt::kKoff, fmt::kMbeg,
                             fmt::kKeys, fmt::kMedi, fmt::kTcrc, fmt::kMcrc, fmt::kTstr,
                             fmt::kVstr}) {
    const Layout::Section* s = layout.Find(tag);
    const uint64_t entry[2] = {uint64_t{tag} << 32 | (s ? s->crc32c : 0), s ? s->bytes : 0};
    bytes.append(reinterpret_cast<const char*>(entry), sizeof(entry));
  }
  // Placeholder positions where the index has them (an index without
  // keeps the identity it had before they existed).
  if (const Layout::Section* s = layout.Find(fmt::kMpos); s != nullptr) {
    const uint64_t entry[2] = {uint64_t{fmt::kMpos} << 32 | s->crc32c, s->bytes};
    bytes.append(reinterpret_cast<const char*>(entry), sizeof(entry));
  }
  for (const std::string& ext : exts_) absl::StrAppend(&bytes, ext.size(), ":", ext);
  for (const IndexShard& sh : shards_) {
    absl::StrAppend(&bytes, sh.name.size(), ":", sh.name, " ", sh.size, " ", sh.crc32c, " ",
                    sh.first_sample, " ", sh.num_samples, "\n");
  }
  const uint32_t a = Crc32c(bytes);
  const uint32_t b = Crc32cExtend(0x9E3779B9u, bytes.data(), bytes.size());
  content_id_ = absl::StrCat(absl::Hex(a, absl::kZeroPad8), absl::Hex(b, absl::kZeroPad8));
}

// The magic, version, size and header checksum, and the counts.
absl::Status Index::ParseHeader(Layout* layout) {
  const char* p = data_.get();
  if (size_ < fmt::kHeaderBytes || std::memcmp(p, fmt::kMagic, 8) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin_,
                     " is not a tutti index (bad magic or too short); build one with "
                     "`tutti index --source DIR --out ",
                     origin_, "`"));
  }
  const uint32_t version = Get<uint32_t>(p + 8);
  if (version != fmt::kVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "index ", origin_, " has format version ", version, " but this tutti reads version ",
        fmt::kVersion, "; re-run `tutti index --source DIR --out ", origin_,
        "` to rebuild it (the dataset's shards are read again)"));
  }
  layout->num_sections = Get<uint32_t>(p + 12);
  const uint64_t file_bytes = Get<uint64_t>(p + 16);
  if (file_bytes != size_) {
    return Damaged(origin_, absl::StrCat("it should be ", file_bytes, " bytes but is ", size_,
                                         " (truncated or appended to)"));
  }
  layout->table_end = fmt::kHeaderBytes + size_t{layout->num_sections} * fmt::kSectionEntryBytes;
  if (layout->num_sections > fmt::kMaxSections || layout->table_end > size_) {
    return Damaged(origin_, "bad section table");
  }
  uint32_t crc = Crc32cExtend(0, p, fmt::kHeaderCrcAt);
  crc = Crc32cExtend(crc, p + fmt::kHeaderBytes, layout->table_end - fmt::kHeaderBytes);
  if (crc != Get<uint32_t>(p + fmt::kHeaderCrcAt)) {
    return Damaged(origin_, "header checksum mismatch");
  }
  for (size_t i = 48; i < fmt::kHeaderCrcAt; ++i) {
    if (p[i] != 0) return Damaged(origin_, "reserved header bytes are not zero");
  }
  layout->samples = Get<uint64_t>(p + 24);
  layout->media = Get<uint64_t>(p + 32);
  layout->num_shards = Get<uint32_t>(p + 40);
  layout->num_exts = Get<uint32_t>(p + 44);
  if (layout->samples >= UINT32_MAX || layout->media >= UINT32_MAX) {
    return Damaged(origin_, "sample count out of range");
  }
  num_samples_ = static_cast<uint32_t>(layout->samples);
  num_media_ = static_cast<uint32_t>(layout->media);
  return absl::OkStatus();
}

// Each section inside the file, aligned, of the size its rows make, with
// its checksum. A section this version does not know is checked alike and
// then ignored, unless it is marked required.
absl::Status Index::ReadSections(Layout* layout) {
  const char* p = data_.get();
  for (uint32_t i = 0; i < layout->num_sections; ++i) {
    const auto e = Get<fmt::SectionEntry>(p + fmt::kHeaderBytes + i * fmt::kSectionEntryBytes);
    const std::string name = fmt::TagName(e.tag);
    if (e.offset % 8 != 0 || e.offset < layout->table_end || e.offset > size_ ||
        e.bytes > size_ - e.offset) {
      return Damaged(origin_, absl::StrCat("section ", name, " lies outside the file"));
    }
    if (e.reserved != 0 || e.rows > fmt::kMaxRows || e.row_bytes == 0 ||
        (e.rows == static_cast<uint8_t>(fmt::Rows::kBytes) && e.row_bytes != 1)) {
      return Damaged(origin_, absl::StrCat("section ", name, " has a bad entry"));
    }
    uint64_t rows = 0;
    switch (static_cast<fmt::Rows>(e.rows)) {
      case fmt::Rows::kBytes:
      case fmt::Rows::kRecords:
        rows = e.bytes / e.row_bytes;
        break;
      case fmt::Rows::kSamples:
        rows = layout->samples;
        break;
      case fmt::Rows::kSamplesPlusOne:
        rows = layout->samples + 1;
        break;
      case fmt::Rows::kMedia:
        rows = layout->media;
        break;
      case fmt::Rows::kShards:
        rows = layout->num_shards;
        break;
    }
    if (rows * e.row_bytes != e.bytes) {
      return Damaged(origin_, absl::StrCat("section ", name, " has ", e.bytes, " bytes, expected ",
                                           rows * e.row_bytes));
    }
    if (SectionCrc(p + e.offset, e.bytes) != e.crc32c) {
      return Damaged(origin_, absl::StrCat("section ", name, " checksum mismatch"));
    }
    const Known* known = FindKnown(e.tag);
    if (known == nullptr && (e.flags & fmt::kRequired)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "index ", origin_, " has a section ", name,
          " that this tutti does not know (written by a newer tutti); use that tutti, or re-run "
          "`tutti index --source DIR --out ",
          origin_, "` with this one"));
    }
    if (known != nullptr &&
        (e.rows != static_cast<uint8_t>(known->rows) || e.row_bytes != known->row_bytes)) {
      return Damaged(origin_, absl::StrCat("section ", name, " has rows of the wrong kind"));
    }
    if (!layout->sections.emplace(e.tag, Layout::Section{p + e.offset, e.bytes, e.crc32c})
             .second) {
      return Damaged(origin_, absl::StrCat("section ", name, " appears twice"));
    }
  }
  return absl::OkStatus();
}

// Every byte outside the header, the table and the sections is padding and
// must be zero, so that no byte of the file goes unchecked.
absl::Status Index::CheckPadding(const Layout& layout) const {
  const char* p = data_.get();
  std::vector<std::pair<uint64_t, uint64_t>> spans = {{0, layout.table_end}};
  for (const auto& [tag, s] : layout.sections) {
    spans.emplace_back(s.data - p, s.data - p + s.bytes);
  }
  std::sort(spans.begin(), spans.end());
  uint64_t covered = 0;
  spans.emplace_back(size_, size_);  // the tail after the last section
  for (const auto& [begin, end] : spans) {
    if (begin < covered) return Damaged(origin_, "sections overlap");
    for (uint64_t i = covered; i < begin; ++i) {
      if (p[i] != 0) return Damaged(origin_, absl::StrCat("stray byte at offset ", i));
    }
    covered = end;
  }
  return absl::OkStatus();
}

// The per-sample arrays (their sizes were checked by ReadSections).
absl::Status Index::BindSections(const Layout& layout) {
  for (const Known& k : kKnown) {
    if (k.needed && layout.Find(k.tag) == nullptr) {
      return Damaged(origin_, absl::StrCat("section ", fmt::TagName(k.tag), " is missing"));
    }
  }
  auto at = [&](uint32_t tag) { return layout.Find(tag)->data; };
  text_ref_ = reinterpret_cast<const uint64_t*>(at(fmt::kTref));
  text_size_ = reinterpret_cast<const uint32_t*>(at(fmt::kTsiz));
  text_tokens_ = reinterpret_cast<const uint32_t*>(at(fmt::kTtok));
  key_off_ = reinterpret_cast<const uint32_t*>(at(fmt::kKoff));
  media_begin_ = reinterpret_cast<const uint32_t*>(at(fmt::kMbeg));
  keys_ = at(fmt::kKeys);
  keys_bytes_ = layout.Find(fmt::kKeys)->bytes;
  media_ = reinterpret_cast<const MediaRecord*>(at(fmt::kMedi));
  text_stream_ = reinterpret_cast<const uint32_t*>(at(fmt::kTstr));
  vl_stream_ = reinterpret_cast<const uint32_t*>(at(fmt::kVstr));
  const uint64_t n_text = layout.Find(fmt::kTstr)->bytes / 4;
  const uint64_t n_vl = layout.Find(fmt::kVstr)->bytes / 4;
  if (n_text + n_vl != layout.samples) {
    return Damaged(origin_, "the sampling streams do not hold every sample once");
  }
  num_text_ = static_cast<uint32_t>(n_text);
  // Member checksums: optional, both or neither.
  const Layout::Section* tcrc = layout.Find(fmt::kTcrc);
  const Layout::Section* mcrc = layout.Find(fmt::kMcrc);
  if ((tcrc == nullptr) != (mcrc == nullptr)) {
    return Damaged(origin_, "member checksums only in part");
  }
  if (tcrc != nullptr) {
    text_crc_ = reinterpret_cast<const uint32_t*>(tcrc->data);
    media_crc_ = reinterpret_cast<const uint32_t*>(mcrc->data);
  }
  if (const Layout::Section* mpos = layout.Find(fmt::kMpos); mpos != nullptr) {
    media_pos_ = reinterpret_cast<const uint32_t*>(mpos->data);
  }
  return absl::OkStatus();
}

// The shard, extension, skip and bad-shard tables (names from the string
// table) and the metadata lines.
absl::Status Index::ReadTables(const Layout& layout) {
  const Layout::Section strs = *layout.Find(fmt::kStrs);
  auto string_at = [&](uint32_t off, uint32_t len, const char* what,
                       std::string* out) -> absl::Status {
    if (uint64_t{off} + len > strs.bytes) return Damaged(origin_, "string table out of range");
    out->assign(strs.data + off, len);
    if (!IsValidUtf8(*out)) return Damaged(origin_, absl::StrCat("a ", what, " is not UTF-8"));
    return absl::OkStatus();
  };
  const char* shrd = layout.Find(fmt::kShrd)->data;
  shards_.resize(layout.num_shards);
  shard_starts_.resize(layout.num_shards);
  for (uint32_t i = 0; i < layout.num_shards; ++i) {
    const auto rec = Get<fmt::ShardRecord>(shrd + i * sizeof(fmt::ShardRecord));
    IndexShard& s = shards_[i];
    if (rec.reserved != 0) return Damaged(origin_, "a shard record has reserved bytes set");
    RETURN_IF_ERROR(string_at(rec.name_off, rec.name_len, "shard name", &s.name));
    s.size = rec.size;
    s.mtime_ns = rec.mtime_ns;
    s.crc32c = rec.crc32c;
    s.first_sample = rec.first_sample;
    s.num_samples = rec.num_samples;
    shard_starts_[i] = rec.first_sample;
    dataset_bytes_ += rec.size;
  }
  const Layout::Section exts = *layout.Find(fmt::kExts);
  if (exts.bytes / sizeof(fmt::StringRecord) != layout.num_exts) {
    return Damaged(origin_, "extension table does not match the header");
  }
  exts_.resize(layout.num_exts);
  for (uint32_t i = 0; i < layout.num_exts; ++i) {
    const auto rec = Get<fmt::StringRecord>(exts.data + i * sizeof(fmt::StringRecord));
    RETURN_IF_ERROR(string_at(rec.off, rec.len, "member extension", &exts_[i]));
  }
  const Layout::Section skip = *layout.Find(fmt::kSkip);
  skips_.resize(skip.bytes / sizeof(fmt::SkipRecord));
  for (size_t i = 0; i < skips_.size(); ++i) {
    const auto rec = Get<fmt::SkipRecord>(skip.data + i * sizeof(fmt::SkipRecord));
    if (rec.shard >= layout.num_shards || rec.count == 0 || rec.reason_len == 0 ||
        (i > 0 && rec.shard < skips_[i - 1].shard)) {
      return Damaged(origin_, "bad skip record");
    }
    skips_[i].shard = rec.shard;
    skips_[i].count = rec.count;
    RETURN_IF_ERROR(string_at(rec.reason_off, rec.reason_len, "skip reason", &skips_[i].reason));
  }
  const Layout::Section bads = *layout.Find(fmt::kBads);
  bad_shards_.resize(bads.bytes / sizeof(fmt::BadShardRecord));
  for (size_t i = 0; i < bad_shards_.size(); ++i) {
    const auto rec = Get<fmt::BadShardRecord>(bads.data + i * sizeof(fmt::BadShardRecord));
    IndexBadShard& b = bad_shards_[i];
    b.size = rec.size;
    b.mtime_ns = rec.mtime_ns;
    RETURN_IF_ERROR(string_at(rec.name_off, rec.name_len, "bad shard's name", &b.name));
    RETURN_IF_ERROR(string_at(rec.why_off, rec.why_len, "bad shard's reason", &b.why));
  }
  const Layout::Section meta = *layout.Find(fmt::kMeta);
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(meta.data, meta.bytes), '\n', absl::SkipEmpty())) {
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) return Damaged(origin_, "bad metadata line");
    std::string value;
    if (!absl::CUnescape(line.substr(eq + 1), &value)) {
      return Damaged(origin_, "bad metadata value");
    }
    meta_.emplace_back(std::string(line.substr(0, eq)), value);
    if (meta_.back().first == "source_dir") source_dir_ = value;
  }
  return absl::OkStatus();
}

absl::Status Index::ValidateSample(uint32_t s, uint64_t shard_size) const {
  if (key_off_[s + 1] < key_off_[s] || key_off_[s + 1] > keys_bytes_ ||
      media_begin_[s + 1] < media_begin_[s] || media_begin_[s + 1] > num_media_) {
    return Damaged(origin_, absl::StrCat("sample ", s, " has a bad key or media range"));
  }
  if (!keys_ascii_ && !IsValidUtf8(key(s))) {
    return Damaged(origin_, absl::StrCat("sample ", s, " has a key that is not UTF-8"));
  }
  const MemberKind tk = text_kind(s);
  if ((tk != MemberKind::kNone && tk != MemberKind::kJson && tk != MemberKind::kTxt) ||
      (tk != MemberKind::kNone && text_ext(s) >= exts_.size()) ||
      text_offset(s) + text_size_[s] > shard_size) {
    return Damaged(origin_, absl::StrCat("sample ", s, " has a bad text member"));
  }
  if (tk == MemberKind::kNone && media_begin_[s + 1] == media_begin_[s]) {
    return Damaged(origin_, absl::StrCat("sample ", s, " has no members"));
  }
  for (uint32_t j = media_begin_[s]; j < media_begin_[s + 1]; ++j) {
    const MediaRecord& r = media_[j];
    const auto kind = static_cast<MemberKind>((r.ref >> 44) & 0xF);
    if (!(IsImage(kind) || kind == MemberKind::kWav) || (r.ref >> 48) >= exts_.size() ||
        (r.ref & kOffsetMask) + r.size > shard_size ||
        (IsImage(kind) && ((r.dims & 0xFFFF) == 0 || (r.dims >> 16) == 0))) {
      return Damaged(origin_, absl::StrCat("sample ", s, " has a bad media member"));
    }
  }
  if (media_pos_ != nullptr && media_begin_[s + 1] > media_begin_[s]) {
    // Each kind's placeholders in member order, none shared, each run's
    // text before it within the text.
    thread_local std::vector<uint32_t> sorted;
    sorted.assign(media_pos_ + media_begin_[s], media_pos_ + media_begin_[s + 1]);
    int64_t last[2] = {-1, -1};
    bool ok = true;
    for (uint32_t j = media_begin_[s]; j < media_begin_[s + 1]; ++j) {
      const bool image = media_is_image(j);
      ok &= int64_t{media_pos_[j]} > last[image];
      last[image] = media_pos_[j];
    }
    std::sort(sorted.begin(), sorted.end());
    for (size_t k = 0; k < sorted.size() && ok; ++k) {
      ok = (k == 0 || sorted[k] > sorted[k - 1]) && sorted[k] - k <= text_tokens_[s];
    }
    if (!ok) {
      return Damaged(origin_, absl::StrCat("sample ", s, " has bad placeholder positions"));
    }
  }
  return absl::OkStatus();
}

uint32_t Index::media_position(uint32_t s, uint32_t j) const {
  if (media_pos_ != nullptr) return media_pos_[j];
  uint32_t images = 0, before = 0;
  const bool image = media_is_image(j);
  for (uint32_t k = media_begin(s); k < media_end(s); ++k) {
    images += media_is_image(k);
    before += k < j && media_is_image(k) == image;
  }
  return image ? before : images + before;
}

void Index::MediaOrder(uint32_t s, std::vector<MediaPlace>* out) const {
  out->clear();
  uint32_t image = 0, audio = 0;
  for (uint32_t j = media_begin(s); j < media_end(s); ++j) {
    const bool is_image = media_is_image(j);
    out->push_back(MediaPlace{j, media_position(s, j), is_image, is_image ? image++ : audio++});
  }
  // By position; text_at is the position less the runs before it.
  std::sort(out->begin(), out->end(),
            [](const MediaPlace& a, const MediaPlace& b) { return a.text_at < b.text_at; });
  for (uint32_t k = 0; k < out->size(); ++k) (*out)[k].text_at -= k;
}

// Every sample in exactly one stream, the one its members say: each
// stream ascends, holds only samples of its kind, and the two hold n
// between them (so each holds all of its kind).
absl::Status Index::ValidateStreams() const {
  const uint32_t n_text = num_text_, n_vl = num_samples_ - num_text_;
  for (const auto& [stream, size, vl] :
       {std::tuple{text_stream_, n_text, false}, std::tuple{vl_stream_, n_vl, true}}) {
    RETURN_IF_ERROR(InRanges(size, [&, stream = stream, vl = vl](uint64_t b, uint64_t e) {
      for (uint64_t i = b; i < e; ++i) {
        const uint32_t s = stream[i];
        if (s >= num_samples_ || is_vl(s) != vl || (i > 0 && stream[i - 1] >= s)) {
          return Damaged(origin_, absl::StrCat("the ", vl ? "VL" : "text-only",
                                               " sampling stream is wrong at its entry ", i));
        }
      }
      return absl::OkStatus();
    }));
  }
  return absl::OkStatus();
}

absl::Status Index::Validate() {
  const uint32_t n = num_samples_;
  if (key_off_[0] != 0 || media_begin_[0] != 0 || key_off_[n] != keys_bytes_ ||
      media_begin_[n] != num_media_) {
    return Damaged(origin_, "sample table bounds do not match");
  }
  uint64_t expect_first = 0;
  for (const IndexShard& s : shards_) {
    // A shard name is opened under the source directory: it must stay inside
    // it, and travel in plans (protobuf strings, UTF-8).
    if (absl::Status bad = CheckRelativeName(s.name, "shard"); !bad.ok()) {
      return Damaged(origin_, bad.message());
    }
    if (s.first_sample != expect_first) return Damaged(origin_, "shard table is not contiguous");
    expect_first += s.num_samples;
  }
  if (expect_first != n) return Damaged(origin_, "shard table does not cover every sample");
  for (const IndexBadShard& b : bad_shards_) {
    if (absl::Status bad = CheckRelativeName(b.name, "bad shard"); !bad.ok()) {
      return Damaged(origin_, bad.message());
    }
  }
  keys_ascii_ = AllAscii(keys_, keys_bytes_);
  RETURN_IF_ERROR(InRanges(n, [&](uint64_t b, uint64_t e) {
    for (uint64_t s = b; s < e;) {
      const uint32_t sh = ShardOfUnchecked(static_cast<uint32_t>(s));
      const uint64_t end =
          std::min<uint64_t>(e, uint64_t{shards_[sh].first_sample} + shards_[sh].num_samples);
      if (end <= s) return Damaged(origin_, "shard table does not cover every sample");
      for (; s < end; ++s) {
        RETURN_IF_ERROR(ValidateSample(static_cast<uint32_t>(s), shards_[sh].size));
      }
    }
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(ValidateStreams());
  // ShardOf's buckets: the shard of every (1 << kShardBucketBits)-th sample.
  shard_bucket_.resize((n >> kShardBucketBits) + 2);
  for (size_t b = 0; b < shard_bucket_.size(); ++b) {
    const uint64_t first = uint64_t{b} << kShardBucketBits;
    shard_bucket_[b] = SearchShard(0, static_cast<uint32_t>(shard_starts_.size()),
                                   static_cast<uint32_t>(std::min<uint64_t>(first, UINT32_MAX)));
  }
  return absl::OkStatus();
}

uint32_t Index::ShardOfUnchecked(uint32_t sample) const {
  return SearchShard(0, static_cast<uint32_t>(shard_starts_.size()), sample);
}

uint32_t Index::SearchShard(uint32_t lo, uint32_t hi, uint32_t sample) const {
  auto it = std::upper_bound(shard_starts_.begin() + lo, shard_starts_.begin() + hi, sample);
  return static_cast<uint32_t>(it - shard_starts_.begin()) - 1;
}

uint32_t Index::ShardOf(uint32_t sample) const {
  const size_t b = sample >> kShardBucketBits;
  if (b + 1 >= shard_bucket_.size()) {
    return SearchShard(0, static_cast<uint32_t>(shard_starts_.size()), sample);
  }
  // The shard lies between those of the bucket's first sample and the
  // next bucket's (shard starts ascend).
  const uint32_t lo = shard_bucket_[b];
  const uint32_t hi =
      std::min<uint32_t>(shard_bucket_[b + 1] + 1, static_cast<uint32_t>(shard_starts_.size()));
  return SearchShard(lo + 1, hi, sample);
}

MediaView Index::media(uint32_t j) const {
  const MediaRecord& r = media_[j];
  MediaView v;
  v.kind = static_cast<MemberKind>((r.ref >> 44) & 0xF);
  v.ext = static_cast<uint16_t>(r.ref >> 48);
  v.offset = r.ref & kOffsetMask;
  v.size = r.size;
  if (IsImage(v.kind)) {
    v.width = r.dims & 0xFFFF;
    v.height = r.dims >> 16;
  } else {
    v.audio_ms = r.dims;
  }
  return v;
}

std::string Index::MemberName(uint32_t s, uint16_t ext) const {
  return absl::StrCat(key(s), ".", exts_[ext]);
}

std::string Index::meta(absl::string_view key) const {
  for (const auto& [k, v] : meta_) {
    if (k == key) return v;
  }
  return "";
}

uint64_t Index::heap_bytes() const {
  uint64_t b = (mapped_ ? 0 : size_) + shard_starts_.capacity() * 4 + shard_bucket_.capacity() * 4 +
               shards_.capacity() * sizeof(IndexShard) + exts_.capacity() * sizeof(std::string) +
               skips_.capacity() * sizeof(IndexSkip) +
               bad_shards_.capacity() * sizeof(IndexBadShard) + origin_.capacity() +
               source_dir_.capacity();
  for (const auto& s : shards_) b += s.name.capacity();
  for (const auto& s : exts_) b += s.capacity();
  for (const auto& s : skips_) b += s.reason.capacity();
  for (const auto& s : bad_shards_) b += s.name.capacity() + s.why.capacity();
  for (const auto& [k, v] : meta_) b += sizeof(k) + sizeof(v) + k.capacity() + v.capacity();
  return b;
}

absl::StatusOr<std::shared_ptr<const Index>> LoadIndex(const std::string& path) {
  uint64_t file_size = 0;
  absl::StatusOr<int> opened = OpenRegularFile(path, &file_size);
  if (!opened.ok()) {
    return Annotate(opened.status(),
                    "cannot read the index (build it with `tutti index --source DIR --out FILE`)");
  }
  const int fd = *opened;
  const size_t size = static_cast<size_t>(file_size);
  if (size < fmt::kHeaderBytes) {
    ::close(fd);
    return Index::FromString(std::string(), path);  // refused as too short, naming the file
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file
  if (map == MAP_FAILED) return ErrnoStatus(err, absl::StrCat("map the index ", path));
  // Loading reads the whole file once, in order; planning reads at random.
  ::madvise(map, size, MADV_SEQUENTIAL);
  ::madvise(map, size, MADV_WILLNEED);
  std::shared_ptr<const char> bytes(static_cast<const char*>(map), [size](const char* p) {
    ::munmap(const_cast<char*>(p), size);
  });
  auto index = Index::Open(std::move(bytes), size, /*mapped=*/true, path);
  if (index.ok()) ::madvise(map, size, MADV_RANDOM);
  return index;
}

}  // namespace tutti::packer
