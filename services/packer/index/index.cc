#include "services/packer/index/index.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "common/status.h"
#include "common/tar.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the index format is little-endian");

namespace tutti::packer {
namespace {

constexpr char kMagic[8] = {'T', 'U', 'T', 'T', 'I', 'I', 'D', 'X'};
constexpr size_t kHeaderBytes = 64;
constexpr size_t kSectionEntryBytes = 24;

constexpr uint32_t Tag(const char (&s)[5]) {
  return uint32_t(uint8_t(s[0])) | uint32_t(uint8_t(s[1])) << 8 | uint32_t(uint8_t(s[2])) << 16 |
         uint32_t(uint8_t(s[3])) << 24;
}
constexpr uint32_t kStrs = Tag("STRS"), kShrd = Tag("SHRD"), kExts = Tag("EXTS"),
                   kMeta = Tag("META"), kTref = Tag("TREF"), kTsiz = Tag("TSIZ"),
                   kTtok = Tag("TTOK"), kKoff = Tag("KOFF"), kMbeg = Tag("MBEG"),
                   kKeys = Tag("KEYS"), kMedi = Tag("MEDI"), kTcrc = Tag("TCRC"),
                   kMcrc = Tag("MCRC");

std::string TagName(uint32_t tag) {
  std::string s(4, ' ');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((tag >> (8 * i)) & 0xFF);
  return s;
}

struct ShardRecord {
  uint64_t size;
  uint32_t crc32c;
  uint32_t first_sample;
  uint32_t num_samples;
  uint32_t name_off;
  uint32_t name_len;
  uint32_t pad;
};
static_assert(sizeof(ShardRecord) == 32);

struct StringRecord {
  uint32_t off;
  uint32_t len;
};

template <typename T>
void Put(std::string* out, size_t at, const T& v) {
  std::memcpy(out->data() + at, &v, sizeof(T));
}
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

// ---------------------------------------------------------------------------
// Index

absl::StatusOr<std::shared_ptr<const Index>> Index::FromBuffer(std::unique_ptr<char[]> data,
                                                               size_t size, std::string origin) {
  std::shared_ptr<Index> index(new Index());
  index->data_ = std::move(data);
  index->size_ = size;
  index->origin_ = std::move(origin);
  RETURN_IF_ERROR(index->Parse());
  RETURN_IF_ERROR(index->Validate());
  return std::shared_ptr<const Index>(std::move(index));
}

absl::StatusOr<std::shared_ptr<const Index>> Index::FromString(const std::string& bytes,
                                                               std::string origin) {
  std::unique_ptr<char[]> data(new char[std::max<size_t>(bytes.size(), 1)]);
  std::memcpy(data.get(), bytes.data(), bytes.size());
  return FromBuffer(std::move(data), bytes.size(), std::move(origin));
}

// Where the file's parts lie, found by ParseHeader and ReadSections.
struct Index::Layout {
  uint32_t num_sections = 0;
  size_t table_end = 0;  // header and section table
  uint64_t samples = 0;
  uint64_t media = 0;
  uint32_t num_shards = 0;
  uint32_t num_exts = 0;
  absl::flat_hash_map<uint32_t, std::pair<const char*, uint64_t>> sections;  // tag -> bytes
};

absl::Status Index::Parse() {
  Layout layout;
  RETURN_IF_ERROR(ParseHeader(&layout));
  RETURN_IF_ERROR(ReadSections(&layout));
  RETURN_IF_ERROR(CheckPadding(layout));
  RETURN_IF_ERROR(BindSections(layout));
  return ReadTables(layout);
}

// The magic, version, size and header checksum, and the counts.
absl::Status Index::ParseHeader(Layout* layout) {
  const char* p = data_.get();
  if (size_ < kHeaderBytes || std::memcmp(p, kMagic, 8) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin_,
                     " is not a tutti index (bad magic or too short); build one with "
                     "`tutti index --source DIR --out ",
                     origin_, "`"));
  }
  const uint32_t version = Get<uint32_t>(p + 8);
  if (version != kIndexVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "index ", origin_, " has format version ", version, " but this tutti reads version ",
        kIndexVersion, "; rebuild it with `tutti index`"));
  }
  layout->num_sections = Get<uint32_t>(p + 12);
  const uint64_t file_bytes = Get<uint64_t>(p + 16);
  if (file_bytes != size_) {
    return Damaged(origin_, absl::StrCat("it should be ", file_bytes, " bytes but is ", size_,
                                         " (truncated or appended to)"));
  }
  layout->table_end = kHeaderBytes + size_t{layout->num_sections} * kSectionEntryBytes;
  if (layout->num_sections > 64 || layout->table_end > size_) {
    return Damaged(origin_, "bad section table");
  }
  uint32_t crc = Crc32cExtend(0, p, 60);
  crc = Crc32cExtend(crc, p + kHeaderBytes, layout->table_end - kHeaderBytes);
  if (crc != Get<uint32_t>(p + 60)) return Damaged(origin_, "header checksum mismatch");
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

// Each section inside the file, aligned, with its checksum.
absl::Status Index::ReadSections(Layout* layout) {
  const char* p = data_.get();
  for (uint32_t i = 0; i < layout->num_sections; ++i) {
    const char* e = p + kHeaderBytes + i * kSectionEntryBytes;
    const uint32_t tag = Get<uint32_t>(e);
    const uint32_t scrc = Get<uint32_t>(e + 4);
    const uint64_t off = Get<uint64_t>(e + 8);
    const uint64_t bytes = Get<uint64_t>(e + 16);
    if (off % 8 != 0 || off < layout->table_end || off > size_ || bytes > size_ - off) {
      return Damaged(origin_, absl::StrCat("section ", TagName(tag), " lies outside the file"));
    }
    if (Crc32cExtend(0, p + off, bytes) != scrc) {
      return Damaged(origin_, absl::StrCat("section ", TagName(tag), " checksum mismatch"));
    }
    layout->sections[tag] = {p + off, bytes};
  }
  // The content's identity: the version, the counts and each section's
  // tag, size and checksum in tag order, the metadata left out.
  std::vector<std::array<uint64_t, 2>> entries;
  for (uint32_t i = 0; i < layout->num_sections; ++i) {
    const char* e = p + kHeaderBytes + i * kSectionEntryBytes;
    const uint32_t tag = Get<uint32_t>(e);
    if (tag == kMeta) continue;
    entries.push_back({uint64_t{tag} << 32 | Get<uint32_t>(e + 4), Get<uint64_t>(e + 16)});
  }
  std::sort(entries.begin(), entries.end());
  std::string id_bytes(p + 8, 4);                // version
  id_bytes.append(p + 24, 24);                   // samples, media, shards, extensions
  for (const auto& entry : entries) id_bytes.append(reinterpret_cast<const char*>(&entry), 16);
  const uint32_t a = Crc32c(id_bytes);
  const uint32_t b = Crc32cExtend(0x9E3779B9u, id_bytes.data(), id_bytes.size());
  content_id_ = absl::StrCat(absl::Hex(a, absl::kZeroPad8), absl::Hex(b, absl::kZeroPad8));
  return absl::OkStatus();
}

// Every byte outside the header, the table and the sections is padding and
// must be zero, so that no byte of the file goes unchecked.
absl::Status Index::CheckPadding(const Layout& layout) const {
  const char* p = data_.get();
  std::vector<std::pair<uint64_t, uint64_t>> spans = {{0, layout.table_end}};
  for (const auto& [tag, s] : layout.sections) {
    spans.emplace_back(s.first - p, s.first - p + s.second);
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

// The per-sample arrays, each section of the size the counts require.
absl::Status Index::BindSections(const Layout& layout) {
  auto section = [&](uint32_t tag, uint64_t want, const char** out) -> absl::Status {
    auto it = layout.sections.find(tag);
    if (it == layout.sections.end()) {
      return Damaged(origin_, absl::StrCat("section ", TagName(tag), " is missing"));
    }
    if (want != UINT64_MAX && it->second.second != want) {
      return Damaged(origin_, absl::StrCat("section ", TagName(tag), " has ", it->second.second,
                                           " bytes, expected ", want));
    }
    *out = it->second.first;
    return absl::OkStatus();
  };
  const uint64_t n = layout.samples;
  const char *strs, *shrd, *exts, *meta, *tref, *tsiz, *ttok, *koff, *mbeg, *keys, *medi;
  RETURN_IF_ERROR(section(kStrs, UINT64_MAX, &strs));
  RETURN_IF_ERROR(section(kShrd, uint64_t{layout.num_shards} * sizeof(ShardRecord), &shrd));
  RETURN_IF_ERROR(section(kExts, uint64_t{layout.num_exts} * sizeof(StringRecord), &exts));
  RETURN_IF_ERROR(section(kMeta, UINT64_MAX, &meta));
  RETURN_IF_ERROR(section(kTref, n * 8, &tref));
  RETURN_IF_ERROR(section(kTsiz, n * 4, &tsiz));
  RETURN_IF_ERROR(section(kTtok, n * 4, &ttok));
  RETURN_IF_ERROR(section(kKoff, (n + 1) * 4, &koff));
  RETURN_IF_ERROR(section(kMbeg, (n + 1) * 4, &mbeg));
  RETURN_IF_ERROR(section(kKeys, UINT64_MAX, &keys));
  RETURN_IF_ERROR(section(kMedi, layout.media * sizeof(MediaRecord), &medi));
  keys_bytes_ = layout.sections.at(kKeys).second;
  // Member checksums: optional (older indexes have none), both or neither.
  if (layout.sections.count(kTcrc) || layout.sections.count(kMcrc)) {
    const char *tcrc, *mcrc;
    RETURN_IF_ERROR(section(kTcrc, n * 4, &tcrc));
    RETURN_IF_ERROR(section(kMcrc, layout.media * 4, &mcrc));
    text_crc_ = reinterpret_cast<const uint32_t*>(tcrc);
    media_crc_ = reinterpret_cast<const uint32_t*>(mcrc);
  }

  text_ref_ = reinterpret_cast<const uint64_t*>(tref);
  text_size_ = reinterpret_cast<const uint32_t*>(tsiz);
  text_tokens_ = reinterpret_cast<const uint32_t*>(ttok);
  key_off_ = reinterpret_cast<const uint32_t*>(koff);
  media_begin_ = reinterpret_cast<const uint32_t*>(mbeg);
  keys_ = keys;
  media_ = reinterpret_cast<const MediaRecord*>(medi);
  return absl::OkStatus();
}

// The shard and extension tables (names from the string table) and the
// metadata lines.
absl::Status Index::ReadTables(const Layout& layout) {
  const auto& [strs, strs_bytes] = layout.sections.at(kStrs);
  auto string_at = [&, strs = strs, strs_bytes = strs_bytes](uint32_t off, uint32_t len,
                                                             std::string* out) -> absl::Status {
    if (uint64_t{off} + len > strs_bytes) return Damaged(origin_, "string table out of range");
    out->assign(strs + off, len);
    return absl::OkStatus();
  };
  const char* shrd = layout.sections.at(kShrd).first;
  shards_.resize(layout.num_shards);
  shard_starts_.resize(layout.num_shards);
  for (uint32_t i = 0; i < layout.num_shards; ++i) {
    const auto rec = Get<ShardRecord>(shrd + i * sizeof(ShardRecord));
    IndexShard& s = shards_[i];
    RETURN_IF_ERROR(string_at(rec.name_off, rec.name_len, &s.name));
    s.size = rec.size;
    s.crc32c = rec.crc32c;
    s.first_sample = rec.first_sample;
    s.num_samples = rec.num_samples;
    shard_starts_[i] = rec.first_sample;
    dataset_bytes_ += rec.size;
  }
  const char* exts = layout.sections.at(kExts).first;
  exts_.resize(layout.num_exts);
  for (uint32_t i = 0; i < layout.num_exts; ++i) {
    const auto rec = Get<StringRecord>(exts + i * sizeof(StringRecord));
    RETURN_IF_ERROR(string_at(rec.off, rec.len, &exts_[i]));
    if (!IsValidUtf8(exts_[i])) return Damaged(origin_, "a member extension is not UTF-8");
  }
  const auto& [meta, meta_bytes] = layout.sections.at(kMeta);
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(meta, meta_bytes), '\n', absl::SkipEmpty())) {
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
  uint32_t shard = 0;
  for (uint32_t s = 0; s < n; ++s) {
    while (shard + 1 < shards_.size() && shards_[shard + 1].first_sample <= s) ++shard;
    if (key_off_[s + 1] < key_off_[s] || media_begin_[s + 1] < media_begin_[s]) {
      return Damaged(origin_, absl::StrCat("sample ", s, " has a bad key or media range"));
    }
    if (!IsValidUtf8(key(s))) {
      return Damaged(origin_, absl::StrCat("sample ", s, " has a key that is not UTF-8"));
    }
    const uint64_t shard_size = shards_.empty() ? 0 : shards_[shard].size;
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
  }
  // Derived sampling streams.
  uint32_t vl = 0;
  for (uint32_t s = 0; s < n; ++s) vl += is_vl(s) ? 1 : 0;
  text_samples_.reserve(n - vl);
  vl_samples_.reserve(vl);
  for (uint32_t s = 0; s < n; ++s) (is_vl(s) ? vl_samples_ : text_samples_).push_back(s);
  // ShardOf's buckets: the shard of every (1 << kShardBucketBits)-th sample.
  shard_bucket_.resize((n >> kShardBucketBits) + 2);
  for (size_t b = 0; b < shard_bucket_.size(); ++b) {
    const uint64_t first = uint64_t{b} << kShardBucketBits;
    shard_bucket_[b] = SearchShard(0, static_cast<uint32_t>(shard_starts_.size()),
                                   static_cast<uint32_t>(std::min<uint64_t>(first, UINT32_MAX)));
  }
  return absl::OkStatus();
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

uint64_t Index::memory_bytes() const {
  uint64_t b = size_ + (text_samples_.capacity() + vl_samples_.capacity()) * 4 +
               shard_starts_.capacity() * 4 + shard_bucket_.capacity() * 4 +
               shards_.capacity() * sizeof(IndexShard);
  for (const auto& s : shards_) b += s.name.capacity();
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
  std::unique_ptr<char[]> data(new char[std::max<size_t>(size, 1)]);
  size_t done = 0;
  while (done < size) {
    const ssize_t r = ::pread(fd, data.get() + done, std::min<size_t>(size - done, 64 << 20),
                              static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = r < 0 ? errno : EIO;
      ::close(fd);
      return ErrnoStatus(err, absl::StrCat("read ", path));
    }
    done += static_cast<size_t>(r);
  }
  ::close(fd);
  return Index::FromBuffer(std::move(data), size, path);
}

// ---------------------------------------------------------------------------
// IndexWriter

IndexWriter::IndexWriter() {
  key_off_.push_back(0);
  media_begin_.push_back(0);
}

void IndexWriter::Reserve(uint64_t samples, uint64_t media, uint64_t key_bytes) {
  text_ref_.reserve(samples);
  text_size_.reserve(samples);
  text_tokens_.reserve(samples);
  key_off_.reserve(samples + 1);
  media_begin_.reserve(samples + 1);
  media_.reserve(media);
  keys_.reserve(key_bytes);
}

absl::Status IndexWriter::AddShard(const std::string& name, uint64_t size, uint32_t crc32c) {
  RETURN_IF_ERROR(CheckRelativeName(name, "shard"));
  IndexShard s;
  s.name = name;
  s.size = size;
  s.crc32c = crc32c;
  s.first_sample = static_cast<uint32_t>(text_tokens_.size());
  shards_.push_back(std::move(s));
  return absl::OkStatus();
}

absl::StatusOr<uint16_t> IndexWriter::ExtId(absl::string_view ext) {
  auto it = ext_ids_.find(std::string(ext));
  if (it != ext_ids_.end()) return it->second;
  if (exts_.size() >= 0xFFFF) {
    return absl::ResourceExhaustedError("more than 65535 distinct member extensions");
  }
  const uint16_t id = static_cast<uint16_t>(exts_.size());
  exts_.emplace_back(ext);
  ext_ids_.emplace(std::string(ext), id);
  return id;
}

absl::Status IndexWriter::AddSample(absl::string_view key, uint32_t text_tokens,
                                    const MemberInput* text, absl::Span<const MemberInput> media) {
  if (shards_.empty()) return absl::FailedPreconditionError("AddSample before AddShard");
  if (text == nullptr && media.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("sample '", key, "' has no members"));
  }
  if (!IsValidUtf8(key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample key '", absl::CHexEscape(key), "' is not valid UTF-8"));
  }
  if (text_tokens_.size() >= UINT32_MAX - 1 || media_.size() + media.size() >= UINT32_MAX ||
      keys_.size() + key.size() >= UINT32_MAX) {
    return absl::ResourceExhaustedError(
        "the index holds at most 4 billion samples, members and key bytes; split the dataset");
  }
  const IndexShard& shard = shards_.back();
  uint64_t ref = 0;
  uint32_t tsize = 0;
  if (text != nullptr) {
    if (text->kind != MemberKind::kJson && text->kind != MemberKind::kTxt) {
      return absl::InvalidArgumentError("text member must be json or txt");
    }
    if (text->offset > Index::kOffsetMask || text->size > UINT32_MAX ||
        text->offset + text->size > shard.size) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample '", key, "' text member lies outside ", shard.name));
    }
    ASSIGN_OR_RETURN(uint16_t ext, ExtId(text->ext));
    ref = text->offset | (uint64_t(text->kind) << 44) | (uint64_t{ext} << 48);
    tsize = static_cast<uint32_t>(text->size);
    member_crcs_ &= text->has_crc32c;
  }
  for (const MemberInput& m : media) {
    if (!(IsImage(m.kind) || m.kind == MemberKind::kWav)) {
      return absl::InvalidArgumentError("media member must be an image or wav");
    }
    if (m.offset > Index::kOffsetMask || m.size > UINT32_MAX || m.offset + m.size > shard.size) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample '", key, "' member ", m.ext, " lies outside ", shard.name));
    }
    if (IsImage(m.kind) &&
        (m.width == 0 || m.height == 0 || m.width > 0xFFFF || m.height > 0xFFFF)) {
      return absl::InvalidArgumentError(absl::StrCat("sample '", key, "' image ", m.ext, " size ",
                                                     m.width, "x", m.height, " is out of range"));
    }
    ASSIGN_OR_RETURN(uint16_t ext, ExtId(m.ext));
    Index::MediaRecord r;
    r.ref = m.offset | (uint64_t(m.kind) << 44) | (uint64_t{ext} << 48);
    r.size = static_cast<uint32_t>(m.size);
    r.dims = IsImage(m.kind) ? (m.width | (m.height << 16)) : m.audio_ms;
    media_.push_back(r);
    media_crc_.push_back(m.crc32c);
    member_crcs_ &= m.has_crc32c;
  }
  text_crc_.push_back(text != nullptr ? text->crc32c : 0);
  text_ref_.push_back(ref);
  text_size_.push_back(tsize);
  text_tokens_.push_back(text_tokens);
  keys_.append(key.data(), key.size());
  key_off_.push_back(static_cast<uint32_t>(keys_.size()));
  media_begin_.push_back(static_cast<uint32_t>(media_.size()));
  ++shards_.back().num_samples;
  return absl::OkStatus();
}

std::string IndexWriter::Finish() const {
  // Strings: shard names, extensions.
  std::string strs;
  std::string shrd(shards_.size() * sizeof(ShardRecord), '\0');
  for (size_t i = 0; i < shards_.size(); ++i) {
    ShardRecord r{};
    r.size = shards_[i].size;
    r.crc32c = shards_[i].crc32c;
    r.first_sample = shards_[i].first_sample;
    r.num_samples = shards_[i].num_samples;
    r.name_off = static_cast<uint32_t>(strs.size());
    r.name_len = static_cast<uint32_t>(shards_[i].name.size());
    strs += shards_[i].name;
    Put(&shrd, i * sizeof(ShardRecord), r);
  }
  std::string exts(exts_.size() * sizeof(StringRecord), '\0');
  for (size_t i = 0; i < exts_.size(); ++i) {
    StringRecord r{static_cast<uint32_t>(strs.size()), static_cast<uint32_t>(exts_[i].size())};
    strs += exts_[i];
    Put(&exts, i * sizeof(StringRecord), r);
  }
  std::string meta = absl::StrCat("source_dir=", absl::CEscape(source_dir_), "\n");
  for (const auto& [k, v] : meta_) absl::StrAppend(&meta, k, "=", absl::CEscape(v), "\n");

  struct Section {
    uint32_t tag;
    const char* data;
    uint64_t bytes;
  };
  std::vector<Section> sections = {
      {kStrs, strs.data(), strs.size()},
      {kShrd, shrd.data(), shrd.size()},
      {kExts, exts.data(), exts.size()},
      {kMeta, meta.data(), meta.size()},
      {kTref, reinterpret_cast<const char*>(text_ref_.data()), text_ref_.size() * 8},
      {kTsiz, reinterpret_cast<const char*>(text_size_.data()), text_size_.size() * 4},
      {kTtok, reinterpret_cast<const char*>(text_tokens_.data()), text_tokens_.size() * 4},
      {kKoff, reinterpret_cast<const char*>(key_off_.data()), key_off_.size() * 4},
      {kMbeg, reinterpret_cast<const char*>(media_begin_.data()), media_begin_.size() * 4},
      {kKeys, keys_.data(), keys_.size()},
      {kMedi, reinterpret_cast<const char*>(media_.data()),
       media_.size() * sizeof(Index::MediaRecord)},
  };
  if (member_crcs_ && !text_tokens_.empty()) {
    sections.push_back(
        {kTcrc, reinterpret_cast<const char*>(text_crc_.data()), text_crc_.size() * 4});
    sections.push_back(
        {kMcrc, reinterpret_cast<const char*>(media_crc_.data()), media_crc_.size() * 4});
  }
  const size_t table_end = kHeaderBytes + sections.size() * kSectionEntryBytes;
  uint64_t total = (table_end + 7) / 8 * 8;
  std::vector<uint64_t> offsets;
  for (const Section& s : sections) {
    offsets.push_back(total);
    total += (s.bytes + 7) / 8 * 8;
  }
  std::string out(total, '\0');
  std::memcpy(out.data(), kMagic, 8);
  Put(&out, 8, kIndexVersion);
  Put(&out, 12, static_cast<uint32_t>(sections.size()));
  Put(&out, 16, total);
  Put(&out, 24, static_cast<uint64_t>(text_tokens_.size()));
  Put(&out, 32, static_cast<uint64_t>(media_.size()));
  Put(&out, 40, static_cast<uint32_t>(shards_.size()));
  Put(&out, 44, static_cast<uint32_t>(exts_.size()));
  for (size_t i = 0; i < sections.size(); ++i) {
    const Section& s = sections[i];
    if (s.bytes > 0) std::memcpy(out.data() + offsets[i], s.data, s.bytes);
    const size_t e = kHeaderBytes + i * kSectionEntryBytes;
    Put(&out, e, s.tag);
    Put(&out, e + 4, Crc32cExtend(0, s.data, s.bytes));
    Put(&out, e + 8, offsets[i]);
    Put(&out, e + 16, s.bytes);
  }
  uint32_t crc = Crc32cExtend(0, out.data(), 60);
  crc = Crc32cExtend(crc, out.data() + kHeaderBytes, table_end - kHeaderBytes);
  Put(&out, 60, crc);
  return out;
}

}  // namespace tutti::packer
