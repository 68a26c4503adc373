// IndexWriter: the index file format (index_format.h) from shards and
// samples added in order.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status.h"
#include "common/tar.h"
#include "services/packer/index/index.h"
#include "services/packer/index/index_column.h"
#include "services/packer/index/index_format.h"

namespace tutti::packer {

namespace fmt = index_format;

namespace {

template <typename T>
void Put(std::string* out, size_t at, const T& v) {
  std::memcpy(out->data() + at, &v, sizeof(T));
}

template <typename T>
void PutBack(std::string* out, const T& v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

}  // namespace

// A section to write: a table built at the end, or a column.
struct IndexWriter::Section {
  uint32_t tag;
  fmt::Rows rows;
  uint16_t row_bytes;
  const std::string* table = nullptr;
  const IndexColumn* column = nullptr;
  uint64_t bytes() const { return table ? table->size() : column->size(); }
  uint32_t crc() const { return table ? Crc32c(*table) : column->crc32c(); }
};

IndexWriter::IndexWriter() {
  for (auto* c : {&text_ref_, &text_size_, &text_tokens_, &key_off_, &media_begin_, &keys_, &media_,
                  &text_crc_, &media_crc_, &text_stream_, &vl_stream_, &media_pos_}) {
    *c = std::make_unique<IndexColumn>();
  }
  key_off_->Push(uint32_t{0});
  media_begin_->Push(uint32_t{0});
}

IndexWriter::~IndexWriter() = default;

absl::Status IndexWriter::SpillTo(const std::string& dir) {
  for (auto* c : {&text_ref_, &text_size_, &text_tokens_, &key_off_, &media_begin_, &keys_, &media_,
                  &text_crc_, &media_crc_, &text_stream_, &vl_stream_, &media_pos_}) {
    RETURN_IF_ERROR((*c)->SpillTo(dir));
  }
  return absl::OkStatus();
}

void IndexWriter::Reserve(uint64_t samples, uint64_t media, uint64_t key_bytes) {
  text_ref_->Reserve(samples * 8);
  text_size_->Reserve(samples * 4);
  text_tokens_->Reserve(samples * 4);
  key_off_->Reserve((samples + 1) * 4);
  media_begin_->Reserve((samples + 1) * 4);
  media_->Reserve(media * sizeof(Index::MediaRecord));
  media_pos_->Reserve(media * 4);
  keys_->Reserve(key_bytes);
}

absl::Status IndexWriter::AddShard(const std::string& name, uint64_t size, uint32_t crc32c,
                                   int64_t mtime_ns) {
  RETURN_IF_ERROR(CheckRelativeName(name, "shard"));
  IndexShard s;
  s.name = name;
  s.size = size;
  s.mtime_ns = mtime_ns;
  s.crc32c = crc32c;
  s.first_sample = static_cast<uint32_t>(num_samples_);
  shards_.push_back(std::move(s));
  return absl::OkStatus();
}

void IndexWriter::AddSkipped(absl::string_view reason, uint32_t count) {
  if (shards_.empty() || count == 0) return;
  skips_.push_back(
      IndexSkip{static_cast<uint32_t>(shards_.size() - 1), std::string(reason), count});
}

absl::Status IndexWriter::AddBadShard(const std::string& name, uint64_t size, int64_t mtime_ns,
                                      absl::string_view why) {
  RETURN_IF_ERROR(CheckRelativeName(name, "shard"));
  bad_shards_.push_back(IndexBadShard{name, size, mtime_ns,
                                      IsValidUtf8(why) ? std::string(why) : absl::CHexEscape(why)});
  return absl::OkStatus();
}

absl::StatusOr<uint16_t> IndexWriter::ExtId(absl::string_view ext) {
  auto it = ext_ids_.find(ext);
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
  if (num_samples_ >= UINT32_MAX - 1 || num_media_ + media.size() >= UINT32_MAX ||
      key_bytes_ + key.size() >= UINT32_MAX) {
    return absl::ResourceExhaustedError(
        "the index holds at most 4 billion samples, members and key bytes; split the dataset");
  }
  // Checked in full before anything is added: a refused sample leaves the
  // writer as it was.
  const IndexShard& shard = shards_.back();
  if (text != nullptr) {
    if (text->kind != MemberKind::kJson && text->kind != MemberKind::kTxt) {
      return absl::InvalidArgumentError("text member must be json or txt");
    }
    if (text->offset > Index::kOffsetMask || text->size > UINT32_MAX ||
        text->offset + text->size > shard.size) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample '", key, "' text member lies outside ", shard.name));
    }
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
  }
  // Placeholder positions: all or none; each kind's in member order, none
  // shared, each run's text before it within the text.
  uint32_t images = 0, placed = 0;
  for (const MemberInput& m : media) images += IsImage(m.kind), placed += m.placeholder_at >= 0;
  positions_.clear();
  bool interleaved = false;
  if (placed > 0) {
    if (placed != media.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample '", key, "': ", placed, " of its ", media.size(),
          " image/audio members have a placeholder position; give one to each or to none"));
    }
    int64_t last[2] = {-1, -1};
    uint32_t image = 0, audio = 0;
    for (const MemberInput& m : media) {
      const bool is_image = IsImage(m.kind);
      if (m.placeholder_at <= last[is_image] || m.placeholder_at >= int64_t{UINT32_MAX}) {
        return absl::InvalidArgumentError(
            absl::StrCat("sample '", key, "' member ", m.ext, ": placeholder position ",
                         m.placeholder_at, " is not after the previous ",
                         is_image ? "image's" : "audio clip's", " (", last[is_image], ")"));
      }
      last[is_image] = m.placeholder_at;
      positions_.push_back(static_cast<uint32_t>(m.placeholder_at));
      interleaved |= m.placeholder_at != (is_image ? image++ : images + audio++);
    }
    std::vector<uint32_t> sorted = positions_;
    std::sort(sorted.begin(), sorted.end());
    for (size_t k = 0; k < sorted.size(); ++k) {
      if ((k > 0 && sorted[k] == sorted[k - 1]) || sorted[k] - k > text_tokens) {
        return absl::InvalidArgumentError(
            absl::StrCat("sample '", key, "': placeholder position ", sorted[k],
                         k > 0 && sorted[k] == sorted[k - 1]
                             ? " is given twice"
                             : absl::StrCat(" lies past its ", text_tokens, " text tokens")));
      }
    }
  } else {
    uint32_t image = 0, audio = 0;
    for (const MemberInput& m : media) {
      positions_.push_back(IsImage(m.kind) ? image++ : images + audio++);
    }
  }
  uint64_t ref = 0;
  if (text != nullptr) {
    ASSIGN_OR_RETURN(uint16_t ext, ExtId(text->ext));
    ref = text->offset | (uint64_t(text->kind) << 44) | (uint64_t{ext} << 48);
    member_crcs_ &= text->has_crc32c;
  }
  for (const MemberInput& m : media) {
    ASSIGN_OR_RETURN(uint16_t ext, ExtId(m.ext));
    Index::MediaRecord r;
    r.ref = m.offset | (uint64_t(m.kind) << 44) | (uint64_t{ext} << 48);
    r.size = static_cast<uint32_t>(m.size);
    r.dims = IsImage(m.kind) ? (m.width | (m.height << 16)) : m.audio_ms;
    media_->Push(r);
    media_crc_->Push(m.crc32c);
    member_crcs_ &= m.has_crc32c;
  }
  media_pos_->Append(positions_.data(), positions_.size() * 4);
  media_positions_ |= interleaved;
  const uint32_t tsize = text != nullptr ? static_cast<uint32_t>(text->size) : 0;
  const uint32_t id = static_cast<uint32_t>(num_samples_);
  (media.empty() ? text_stream_ : vl_stream_)->Push(id);
  text_crc_->Push(text != nullptr ? text->crc32c : uint32_t{0});
  text_ref_->Push(ref);
  text_size_->Push(tsize);
  text_tokens_->Push(text_tokens);
  keys_->Append(key.data(), key.size());
  key_bytes_ += key.size();
  num_media_ += media.size();
  ++num_samples_;
  key_off_->Push(static_cast<uint32_t>(key_bytes_));
  media_begin_->Push(static_cast<uint32_t>(num_media_));
  ++shards_.back().num_samples;
  return absl::OkStatus();
}

absl::Status IndexWriter::CopySample(const Index& from, uint32_t s) {
  const bool crcs = from.has_member_crc32c();
  MemberInput text;
  const bool has_text = from.text_kind(s) != MemberKind::kNone;
  if (has_text) {
    text.kind = from.text_kind(s);
    text.ext = std::string(from.ext(from.text_ext(s)));
    text.offset = from.text_offset(s);
    text.size = from.text_size(s);
    text.has_crc32c = crcs;
    text.crc32c = crcs ? from.text_crc32c(s) : 0;
  }
  copy_media_.resize(from.media_end(s) - from.media_begin(s));
  for (uint32_t j = from.media_begin(s); j < from.media_end(s); ++j) {
    const MediaView v = from.media(j);
    MemberInput& m = copy_media_[j - from.media_begin(s)];
    m.kind = v.kind;
    m.ext = std::string(from.ext(v.ext));
    m.offset = v.offset;
    m.size = v.size;
    m.width = v.width;
    m.height = v.height;
    m.audio_ms = v.audio_ms;
    m.has_crc32c = crcs;
    m.crc32c = crcs ? from.media_crc32c(j) : 0;
    m.placeholder_at = from.has_media_positions() ? int64_t{from.media_position(s, j)} : -1;
  }
  return AddSample(from.key(s), from.text_tokens(s), has_text ? &text : nullptr, copy_media_);
}

absl::Status IndexWriter::CopyShard(const Index& from, uint32_t shard) {
  const IndexShard& sh = from.shard(shard);
  RETURN_IF_ERROR(AddShard(sh.name, sh.size, sh.crc32c, sh.mtime_ns));
  for (uint32_t s = sh.first_sample; s < sh.first_sample + sh.num_samples; ++s) {
    RETURN_IF_ERROR(CopySample(from, s));
  }
  for (const IndexSkip& k : from.skips()) {
    if (k.shard == shard) AddSkipped(k.reason, k.count);
  }
  return absl::OkStatus();
}

absl::Status IndexWriter::status() const {
  for (const auto* c :
       {&text_ref_, &text_size_, &text_tokens_, &key_off_, &media_begin_, &keys_, &media_,
        &text_crc_, &media_crc_, &text_stream_, &vl_stream_, &media_pos_}) {
    RETURN_IF_ERROR((*c)->status());
  }
  return absl::OkStatus();
}

// The tables (strings, shards, extensions, metadata, skips, bad shards) into
// the given strings, and every section in file order.
std::vector<IndexWriter::Section> IndexWriter::Sections(std::string* strs, std::string* shrd,
                                                        std::string* exts, std::string* meta,
                                                        std::string* skip,
                                                        std::string* bads) const {
  auto str = [&](absl::string_view s) {
    const uint32_t off = static_cast<uint32_t>(strs->size());
    strs->append(s.data(), s.size());
    return std::pair<uint32_t, uint32_t>(off, static_cast<uint32_t>(s.size()));
  };
  for (const IndexShard& s : shards_) {
    fmt::ShardRecord r{};
    r.size = s.size;
    r.mtime_ns = s.mtime_ns;
    r.crc32c = s.crc32c;
    r.first_sample = s.first_sample;
    r.num_samples = s.num_samples;
    std::tie(r.name_off, r.name_len) = str(s.name);
    PutBack(shrd, r);
  }
  for (const std::string& e : exts_) {
    fmt::StringRecord r{};
    std::tie(r.off, r.len) = str(e);
    PutBack(exts, r);
  }
  for (const IndexSkip& k : skips_) {
    fmt::SkipRecord r{};
    r.shard = k.shard;
    std::tie(r.reason_off, r.reason_len) = str(k.reason);
    r.count = k.count;
    PutBack(skip, r);
  }
  std::vector<const IndexBadShard*> bad;
  for (const IndexBadShard& b : bad_shards_) bad.push_back(&b);
  std::sort(bad.begin(), bad.end(), [](const auto* a, const auto* b) { return a->name < b->name; });
  for (const IndexBadShard* b : bad) {
    fmt::BadShardRecord r{};
    r.size = b->size;
    r.mtime_ns = b->mtime_ns;
    std::tie(r.name_off, r.name_len) = str(b->name);
    std::tie(r.why_off, r.why_len) = str(b->why);
    PutBack(bads, r);
  }
  *meta = absl::StrCat("source_dir=", absl::CEscape(source_dir_), "\n");
  for (const auto& [k, v] : meta_) absl::StrAppend(meta, k, "=", absl::CEscape(v), "\n");

  using R = fmt::Rows;
  std::vector<Section> s = {
      {fmt::kStrs, R::kBytes, 1, strs},
      {fmt::kShrd, R::kShards, sizeof(fmt::ShardRecord), shrd},
      {fmt::kExts, R::kRecords, sizeof(fmt::StringRecord), exts},
      {fmt::kMeta, R::kBytes, 1, meta},
      {fmt::kSkip, R::kRecords, sizeof(fmt::SkipRecord), skip},
      {fmt::kBads, R::kRecords, sizeof(fmt::BadShardRecord), bads},
      {fmt::kTref, R::kSamples, 8, nullptr, text_ref_.get()},
      {fmt::kTsiz, R::kSamples, 4, nullptr, text_size_.get()},
      {fmt::kTtok, R::kSamples, 4, nullptr, text_tokens_.get()},
      {fmt::kKoff, R::kSamplesPlusOne, 4, nullptr, key_off_.get()},
      {fmt::kMbeg, R::kSamplesPlusOne, 4, nullptr, media_begin_.get()},
      {fmt::kKeys, R::kBytes, 1, nullptr, keys_.get()},
      {fmt::kMedi, R::kMedia, sizeof(Index::MediaRecord), nullptr, media_.get()},
      {fmt::kTstr, R::kRecords, 4, nullptr, text_stream_.get()},
      {fmt::kVstr, R::kRecords, 4, nullptr, vl_stream_.get()},
  };
  if (member_crcs_ && num_samples_ > 0) {
    s.push_back({fmt::kTcrc, R::kSamples, 4, nullptr, text_crc_.get()});
    s.push_back({fmt::kMcrc, R::kMedia, 4, nullptr, media_crc_.get()});
  }
  if (media_positions_) s.push_back({fmt::kMpos, R::kMedia, 4, nullptr, media_pos_.get()});
  return s;
}

namespace {

// The header and section table for `sections` laid out from the table's end.
template <typename Sections>
std::string HeaderAndTable(const Sections& sections, uint64_t samples, uint64_t media,
                           uint32_t shards, uint32_t exts, std::vector<uint64_t>* offsets,
                           uint64_t* total) {
  const size_t table_end = fmt::kHeaderBytes + sections.size() * fmt::kSectionEntryBytes;
  uint64_t at = (table_end + 7) / 8 * 8;
  for (const auto& s : sections) {
    offsets->push_back(at);
    at += (s.bytes() + 7) / 8 * 8;
  }
  *total = at;
  std::string head((table_end + 7) / 8 * 8, '\0');
  std::memcpy(head.data(), fmt::kMagic, 8);
  Put(&head, 8, fmt::kVersion);
  Put(&head, 12, static_cast<uint32_t>(sections.size()));
  Put(&head, 16, at);
  Put(&head, 24, samples);
  Put(&head, 32, media);
  Put(&head, 40, shards);
  Put(&head, 44, exts);
  for (size_t i = 0; i < sections.size(); ++i) {
    fmt::SectionEntry e{};
    e.tag = sections[i].tag;
    e.crc32c = sections[i].crc();
    e.offset = (*offsets)[i];
    e.bytes = sections[i].bytes();
    e.rows = static_cast<uint8_t>(sections[i].rows);
    e.flags = fmt::kRequired;
    e.row_bytes = sections[i].row_bytes;
    Put(&head, fmt::kHeaderBytes + i * fmt::kSectionEntryBytes, e);
  }
  uint32_t crc = Crc32cExtend(0, head.data(), fmt::kHeaderCrcAt);
  crc = Crc32cExtend(crc, head.data() + fmt::kHeaderBytes, table_end - fmt::kHeaderBytes);
  Put(&head, fmt::kHeaderCrcAt, crc);
  return head;
}

}  // namespace

std::string IndexWriter::Finish() const {
  std::string strs, shrd, exts, meta, skip, bads;
  const std::vector<Section> sections = Sections(&strs, &shrd, &exts, &meta, &skip, &bads);
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  std::string out =
      HeaderAndTable(sections, num_samples_, num_media_, static_cast<uint32_t>(shards_.size()),
                     static_cast<uint32_t>(exts_.size()), &offsets, &total);
  out.reserve(total);
  for (size_t i = 0; i < sections.size(); ++i) {
    out.resize(offsets[i], '\0');
    if (sections[i].table) {
      out += *sections[i].table;
    } else {
      // A spilled column's read-back fails only with its temporary file;
      // WriteFile reports that, Finish (tests, fuzzing) holds columns in memory.
      (void)sections[i].column->AppendTo(&out);
    }
  }
  out.resize(total, '\0');
  return out;
}

absl::Status IndexWriter::WriteFile(const std::string& path) const {
  RETURN_IF_ERROR(status());
  std::string strs, shrd, exts, meta, skip, bads;
  const std::vector<Section> sections = Sections(&strs, &shrd, &exts, &meta, &skip, &bads);
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  const std::string head =
      HeaderAndTable(sections, num_samples_, num_media_, static_cast<uint32_t>(shards_.size()),
                     static_cast<uint32_t>(exts_.size()), &offsets, &total);
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create ", tmp));
  auto write = [&]() -> absl::Status {
    // The padding is the holes of a file grown to its full size.
    if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
      return ErrnoStatus(errno, absl::StrCat("size ", tmp));
    }
    for (size_t i = 0; i < sections.size(); ++i) {
      if (sections[i].table) {
        const std::string& t = *sections[i].table;
        for (size_t done = 0; done < t.size();) {
          const ssize_t w =
              ::pwrite(fd, t.data() + done, t.size() - done, static_cast<off_t>(offsets[i] + done));
          if (w < 0 && errno == EINTR) continue;
          if (w <= 0) return ErrnoStatus(w < 0 ? errno : EIO, absl::StrCat("write ", tmp));
          done += static_cast<size_t>(w);
        }
      } else {
        RETURN_IF_ERROR(sections[i].column->WriteTo(fd, offsets[i]));
      }
    }
    for (size_t done = 0; done < head.size();) {
      const ssize_t w = ::pwrite(fd, head.data() + done, head.size() - done, done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return ErrnoStatus(w < 0 ? errno : EIO, absl::StrCat("write ", tmp));
      done += static_cast<size_t>(w);
    }
    if (::fsync(fd) != 0) return ErrnoStatus(errno, absl::StrCat("fsync ", tmp));
    return absl::OkStatus();
  };
  absl::Status s = write();
  if (::close(fd) != 0 && s.ok()) s = ErrnoStatus(errno, absl::StrCat("close ", tmp));
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = ErrnoStatus(errno, absl::StrCat("rename ", tmp, " to ", path));
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

}  // namespace tutti::packer
