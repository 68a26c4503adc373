#include "services/packer/index/shard_scan.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/media_header.h"
#include "common/status.h"
#include "common/tar.h"
#include "services/packer/index/text_tokens.h"

namespace tutti::packer {

// ---------------------------------------------------------------------------
// ShardChecksums

uint32_t ShardChecksums::Add(uint64_t offset, uint64_t size) {
  ranges_.push_back(Range{offset, size, 0});
  return static_cast<uint32_t>(ranges_.size() - 1);
}

void ShardChecksums::Feed(uint64_t off, absl::string_view bytes) {
  const uint64_t n = bytes.size();
  file_ = Crc32cExtend(file_, bytes.data(), n);
  for (size_t i = first_; i < ranges_.size() && ranges_[i].offset < off + n; ++i) {
    Range& m = ranges_[i];
    const uint64_t begin = std::max(m.offset, off), end = std::min(m.offset + m.size, off + n);
    if (end > begin) m.crc = Crc32cExtend(m.crc, bytes.data() + (begin - off), end - begin);
    if (m.offset + m.size <= off + n && i == first_) ++first_;
  }
}

absl::Status ChecksumPass(const RandomAccessFile& f, ShardChecksums* sums) {
  const uint64_t size = f.size();
  std::string buf(std::min<uint64_t>(size, 4 << 20), '\0');
  for (uint64_t off = 0; off < size;) {
    const size_t n = std::min<uint64_t>(buf.size(), size - off);
    RETURN_IF_ERROR(f.ReadExactly(off, n, buf.data()));
    sums->Feed(off, absl::string_view(buf.data(), n));
    off += n;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// ShardScanner

namespace {

// Sort key for image/audio extensions: "jpg" < "0.jpg" < "1.png" < "10.webp".
std::pair<int64_t, std::string> MediaOrder(const std::string& ext) {
  const size_t dot = ext.find('.');
  int64_t n = -1;
  if (dot != std::string::npos && !absl::SimpleAtoi(ext.substr(0, dot), &n)) n = INT64_MAX;
  return {n, ext};
}

// The lower-case last part of an extension: "0.JPG" -> "jpg".
std::string LastExtension(const std::string& ext) {
  const size_t dot = ext.rfind('.');
  return absl::AsciiStrToLower(dot == std::string::npos ? ext : ext.substr(dot + 1));
}

// Reads enough of a member to parse its header (growing for JPEGs whose
// frame header follows large metadata segments).
template <typename Parse>
auto ReadHeader(const RandomAccessFile& f, uint64_t offset, uint64_t size, Parse parse)
    -> decltype(parse(absl::string_view())) {
  size_t want = std::min<uint64_t>(size, 4096);
  while (true) {
    auto bytes = f.ReadString(offset, want);
    if (!bytes.ok()) return bytes.status();
    auto h = parse(*bytes);
    if (h.ok() || want >= size || want >= (4u << 20)) return h;
    want = std::min<uint64_t>(size, want * 16);
  }
}

}  // namespace

// A tar member of a sample, with what its header or text says (read as the
// walk passes it, so a streamed shard is read once).
struct ShardScanner::Member {
  std::string ext;  // full extension, e.g. "0.jpg"
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t id = 0;  // its checksum in ShardChecksums
  absl::StatusOr<ImageHeader> image = absl::UnknownError("not probed");
  absl::StatusOr<AudioHeader> wav = absl::UnknownError("not probed");
  absl::Status json_read;  // reading k.json failed
  // k.json as read (its ids dropped once counted: a shard's samples are
  // checked after the walk), and its text tokens.
  absl::StatusOr<SampleJson> json = absl::UnknownError("not probed");
  absl::StatusOr<uint32_t> json_tokens = absl::UnknownError("not probed");
  std::vector<std::string> json_unknown;  // k.json fields tutti does not know
};

struct ShardScanner::Group {
  std::string key;
  std::vector<Member> members;
  std::string bad_name;  // a member whose name is not UTF-8 (escaped), if any
};

void ShardScanner::Probe(const RandomAccessFile& f, Member* m) {
  const std::string last = LastExtension(m->ext);
  if (ImageKindFromExtension(last) != ImageKind::kUnknown) {
    m->image =
        ReadHeader(f, m->offset, m->size, [](absl::string_view b) { return ReadImageHeader(b); });
  } else if (last == "wav") {
    m->wav =
        ReadHeader(f, m->offset, m->size, [size = m->size](absl::string_view b) {
          return ReadWavHeader(b, size);
        });
  } else if (m->ext == "json" && m->size <= o_.max_text_bytes) {
    auto bytes = f.ReadString(m->offset, m->size);
    if (!bytes.ok()) {
      m->json_read = bytes.status();
      return;
    }
    SampleJsonOptions jo;
    jo.vocab_size = o_.vocab_size;
    jo.image_placeholder_id = o_.image_placeholder_id;
    jo.audio_placeholder_id = o_.audio_placeholder_id;
    m->json = ParseSampleJson(*bytes, jo);
    if (!m->json.ok()) {
      m->json_tokens = m->json.status();
      return;
    }
    m->json_tokens = TokenCount(*m->json, o_.bytes_per_token);
    m->json->input_ids = {};
    m->json->trained = {};
    m->json->meta = {};
    m->json_unknown = m->json->unknown_fields;
  }
}

ShardResult ShardScanner::Scan(const RandomAccessFile& file, ShardChecksums* sums,
                               const std::function<absl::Status()>& finish) {
  ShardResult r;
  // Its name travels in every plan: a relative UTF-8 path under --source.
  r.status = CheckRelativeName(rel_, "shard");
  if (!r.status.ok()) return r;
  r.size = file.size();
  if (r.size == 0) {
    r.status = absl::DataLossError("empty file (0 bytes); re-copy the shard from its source");
    return r;
  }
  std::vector<Group> groups;
  absl::flat_hash_map<std::string, size_t> by_key;
  uint64_t members = 0;
  const auto too_many = [&] {
    return absl::ResourceExhaustedError(absl::StrCat(
        "more than ", o_.max_shard_members, " tar members, over the limit (--max-shard-members ",
        o_.max_shard_members, "); split the shard"));
  };
  r.status = ForEachTarMember(
      file,
      [&](const TarMember& m) {
        if (++members > o_.max_shard_members) return too_many();
        auto [key, ext] = SplitWebDatasetName(m.name);
        if (ext.empty() || key.empty()) {
          ++r.ignored;
          return absl::OkStatus();
        }
        auto [it, inserted] = by_key.try_emplace(std::string(key), groups.size());
        if (inserted) groups.push_back(Group{std::string(key), {}, {}});
        Group& g = groups[it->second];
        if (!IsValidUtf8(m.name) && g.bad_name.empty()) g.bad_name = absl::CHexEscape(m.name);
        Member member;
        member.ext = std::string(ext);
        member.offset = m.data_offset;
        member.size = m.size;
        member.id = sums->Add(m.data_offset, m.size);
        Probe(file, &member);
        g.members.push_back(std::move(member));
        return absl::OkStatus();
      },
      [&](const TarMember& m, absl::string_view why) {
        if (++members > o_.max_shard_members) return;  // refused below
        ++r.skipped_members["link"];
        if (r.examples.size() < 8) {
          r.examples.push_back(
              absl::StrCat(rel_, ": member ", absl::CHexEscape(m.name), " is ", why));
        }
      });
  if (r.status.ok() && members > o_.max_shard_members) r.status = too_many();
  if (!r.status.ok()) return r;
  if (members == 0) {
    r.status = absl::DataLossError("a tar archive with no members");
    return r;
  }
  r.status = finish();
  if (!r.status.ok()) return r;
  r.crc32c = sums->file_crc32c();
  for (Group& g : groups) ScanSample(&g, *sums, &r);
  return r;
}

void ShardScanner::Skip(ShardResult* r, const std::string& key, const std::string& reason,
                        const std::string& detail) {
  ++r->skipped[reason];
  if (r->examples.size() < 8) {
    r->examples.push_back(absl::StrCat(rel_, ":", absl::CHexEscape(key), ": ", detail));
  }
}

void ShardScanner::ScanSample(Group* g, const ShardChecksums& sums, ShardResult* r) {
  if (!g->bad_name.empty()) {
    return Skip(r, g->key, "bad_name",
                absl::StrCat("member name '", g->bad_name,
                             "' is not valid UTF-8 (names travel in protobuf strings); rename it"));
  }
  SampleOut s;
  s.key = g->key;
  const Member* json = nullptr;
  const Member* txt = nullptr;
  std::vector<std::pair<const Member*, bool>> media;  // (member, is audio)
  absl::flat_hash_map<std::string, int> seen;
  for (const Member& m : g->members) {
    if (++seen[m.ext] > 1) {
      return Skip(r, g->key, "duplicate_member",
                  absl::StrCat("member ", g->key, ".", m.ext, " appears twice"));
    }
    const std::string last = LastExtension(m.ext);
    if (ImageKindFromExtension(last) != ImageKind::kUnknown) {
      media.emplace_back(&m, false);  // its kind comes from the magic bytes
    } else if (last == "wav") {
      media.emplace_back(&m, true);
    } else if (m.ext == "json") {
      json = &m;
    } else if (m.ext == "txt") {
      txt = &m;
    } else {
      ++r->ignored;
    }
  }
  const size_t images =
      std::count_if(media.begin(), media.end(), [](const auto& m) { return !m.second; });
  if (images > o_.max_images_per_sample) {
    return Skip(r, g->key, "too_many_images",
                absl::StrCat(g->key, " has ", images, " images, over the limit (",
                             "--max-images-per-sample ", o_.max_images_per_sample, ")"));
  }
  std::sort(media.begin(), media.end(), [](const auto& a, const auto& b) {
    return MediaOrder(a.first->ext) < MediaOrder(b.first->ext);
  });
  auto text_input = [&](MemberKind kind, const char* ext, const Member& m) {
    MemberInput in;
    in.kind = kind;
    in.ext = ext;
    in.offset = m.offset;
    in.size = m.size;
    in.has_crc32c = true;
    in.crc32c = sums.crc32c(m.id);
    return in;
  };
  for (const auto& [m, audio] : media) {
    MemberInput in;
    in.ext = m->ext;
    in.offset = m->offset;
    in.size = m->size;
    in.has_crc32c = true;
    in.crc32c = sums.crc32c(m->id);
    if (audio) {
      if (!m->wav.ok()) {
        return Skip(r, g->key, "bad_audio_header",
                    absl::StrCat(g->key, ".", m->ext, ": ", m->wav.status().message()));
      }
      in.kind = MemberKind::kWav;
      in.audio_ms = m->wav->duration_ms;
    } else {
      const auto& h = m->image;
      if (!h.ok()) {
        return Skip(r, g->key, "bad_image_header",
                    absl::StrCat(g->key, ".", m->ext, ": ", h.status().message()));
      }
      in.kind = h->kind == ImageKind::kJpeg  ? MemberKind::kJpeg
                : h->kind == ImageKind::kPng ? MemberKind::kPng
                                             : MemberKind::kWebp;
      in.width = h->width;
      in.height = h->height;
      const double aspect = double(std::max(h->width, h->height)) / std::min(h->width, h->height);
      if (h->width > o_.max_source_side || h->height > o_.max_source_side ||
          uint64_t{h->width} * h->height > o_.max_source_pixels) {
        return Skip(r, g->key, "image_too_large",
                    absl::StrCat(g->key, ".", m->ext, " is ", h->width, "x", h->height));
      }
      if (aspect > o_.max_aspect_ratio) {
        return Skip(r, g->key, "aspect_ratio",
                    absl::StrCat(g->key, ".", m->ext, " is ", h->width, "x", h->height));
      }
    }
    s.media.push_back(std::move(in));
  }
  bool have_tokens = false;
  if (json != nullptr) {
    if (json->size > o_.max_text_bytes) {
      return Skip(r, g->key, "text_too_large",
                  absl::StrCat(g->key, ".json has ", json->size, " bytes"));
    }
    if (!json->json_read.ok()) {
      return Skip(r, g->key, "read_error", std::string(json->json_read.message()));
    }
    if (json->json.ok()) {
      const size_t audio =
          std::count_if(media.begin(), media.end(), [](const auto& m) { return m.second; });
      absl::Status st = CheckPlaceholders(*json->json, images, audio);
      if (!st.ok()) {
        const bool unknown = o_.image_placeholder_id < 0 && o_.audio_placeholder_id < 0;
        return Skip(r, g->key, "placeholder_mismatch",
                    absl::StrCat(g->key, ".json: ", st.message(),
                                 unknown ? " (no placeholder id is known: the index takes them "
                                           "from the dataset's tutti_dataset.json or "
                                           "--image-placeholder-id/--audio-placeholder-id)"
                                         : ""));
      }
      if (json->json->schema == 2) {
        // Where each run goes: its placeholder's index in input_ids.
        size_t image = 0, clip = 0;
        for (MemberInput& in : s.media) {
          in.placeholder_at = IsImage(in.kind) ? json->json->image_positions[image++]
                                               : json->json->audio_positions[clip++];
        }
      }
    }
    if (!json->json_unknown.empty()) {
      ++r->unknown_json_members;
      for (const std::string& field : json->json_unknown) {
        auto it = r->unknown_json_fields.find(field);
        if (it != r->unknown_json_fields.end()) {
          ++it->second;
        } else if (r->unknown_json_fields.size() < 32) {
          r->unknown_json_fields.emplace(field, 1);
        } else {
          ++r->unknown_json_other;
        }
      }
    }
    const auto& tokens = json->json_tokens;
    if (tokens.status().code() == absl::StatusCode::kOutOfRange) {
      return Skip(r, g->key, "token_out_of_vocab",
                  absl::StrCat(g->key, ".json: ", tokens.status().message(), " (--vocab-size)"));
    }
    if (tokens.ok()) {
      s.text_tokens = *tokens;
      have_tokens = true;
      s.has_text = true;
      s.text = text_input(MemberKind::kJson, "json", *json);
    } else if (tokens.status().code() != absl::StatusCode::kNotFound || txt == nullptr) {
      const bool missing = tokens.status().code() == absl::StatusCode::kNotFound;
      if (!missing || s.media.empty()) {
        return Skip(r, g->key, missing ? "no_token_count" : "bad_json",
                    absl::StrCat(g->key, ".json: ", tokens.status().message()));
      }
      // A VL sample whose JSON carries only metadata: no text tokens.
      s.has_text = true;
      have_tokens = true;
      s.text = text_input(MemberKind::kJson, "json", *json);
    }
  }
  if (!have_tokens && txt != nullptr) {
    s.text_tokens = EstimateTextTokens(txt->size, o_.bytes_per_token);
    s.has_text = true;
    s.text = text_input(MemberKind::kTxt, "txt", *txt);
  }
  if (!s.has_text && s.media.empty()) {
    return Skip(r, g->key, "no_usable_member",
                absl::StrCat(g->key, " has no .json, .txt, image or .wav member"));
  }
  r->samples.push_back(std::move(s));
}

}  // namespace tutti::packer
