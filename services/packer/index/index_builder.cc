#include "services/packer/index/index_builder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "common/media_header.h"
#include "common/root_dir.h"
#include "common/status.h"
#include "common/tar.h"
#include "services/packer/index/index.h"

namespace tutti::packer {
namespace {

namespace fs = std::filesystem;

struct SampleOut {
  std::string key;
  uint32_t text_tokens = 0;
  bool has_text = false;
  MemberInput text;
  std::vector<MemberInput> media;
};

struct ShardResult {
  absl::Status status;
  uint64_t size = 0;
  uint32_t crc32c = 0;
  std::vector<SampleOut> samples;
  std::map<std::string, uint64_t> skipped;
  std::map<std::string, uint64_t> skipped_members;
  std::vector<std::string> examples;
  uint64_t ignored = 0;
  // k.json fields tutti does not read: members carrying any, and per name.
  uint64_t unknown_json_members = 0;
  std::map<std::string, uint64_t> unknown_json_fields;  // at most 32 names
  uint64_t unknown_json_other = 0;
};

struct RawMember {
  std::string ext;  // full extension, e.g. "0.jpg"
  uint64_t offset;
  uint64_t size;
  uint32_t crc32c = 0;  // of its bytes
};

struct Group {
  std::string key;
  std::vector<RawMember> members;
  std::string bad_name;  // a member whose name is not UTF-8 (escaped), if any
};

MemberInput TextInput(MemberKind kind, const char* ext, const RawMember& m) {
  MemberInput in;
  in.kind = kind;
  in.ext = ext;
  in.offset = m.offset;
  in.size = m.size;
  in.has_crc32c = true;
  in.crc32c = m.crc32c;
  return in;
}

// Sort key for image/audio extensions: "jpg" < "0.jpg" < "1.png" < "10.webp".
std::pair<int64_t, std::string> MediaOrder(const std::string& ext) {
  const size_t dot = ext.find('.');
  int64_t n = -1;
  if (dot != std::string::npos && !absl::SimpleAtoi(ext.substr(0, dot), &n)) n = INT64_MAX;
  return {n, ext};
}

class ShardScanner {
 public:
  ShardScanner(const IndexBuildOptions& o, const std::string& rel) : o_(o), rel_(rel) {}

  ShardResult Scan(const std::string& path) {
    ShardResult r;
    // Its name travels in every plan: a relative UTF-8 path under --source.
    r.status = CheckRelativeName(rel_, "shard");
    if (!r.status.ok()) return r;
    auto file = OpenLocalFile(path);
    if (!file.ok()) {
      r.status = file.status();
      return r;
    }
    r.size = (*file)->size();
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
        **file,
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
          g.members.push_back(RawMember{std::string(ext), m.data_offset, m.size});
          return absl::OkStatus();
        },
        [&](const TarMember& m, absl::string_view why) {
          if (++members > o_.max_shard_members) return;  // refused below
          ++r.skipped_members["link"];
          if (r.examples.size() < 8) {
            r.examples.push_back(absl::StrCat(rel_, ": member ", absl::CHexEscape(m.name), " is ", why));
          }
        });
    if (r.status.ok() && members > o_.max_shard_members) r.status = too_many();
    if (!r.status.ok()) return r;
    if (members == 0) {
      r.status = absl::DataLossError("a tar archive with no members");
      return r;
    }
    r.status = Checksum(**file, &groups, &r.crc32c);
    if (!r.status.ok()) return r;
    for (Group& g : groups) ScanSample(**file, &g, &r);
    return r;
  }

 private:
  // One sequential pass over the shard: the crc32c of the whole file (the
  // stager verifies staged copies with it) and of every member's bytes (it
  // verifies each member it reads with those).
  static absl::Status Checksum(const RandomAccessFile& f, std::vector<Group>* groups,
                               uint32_t* shard_crc) {
    std::vector<RawMember*> members;
    for (Group& g : *groups) {
      for (RawMember& m : g.members) members.push_back(&m);
    }
    std::sort(members.begin(), members.end(),
              [](const RawMember* a, const RawMember* b) { return a->offset < b->offset; });
    const uint64_t size = f.size();
    std::string buf(std::min<uint64_t>(size, 4 << 20), '\0');
    uint32_t crc = 0;
    size_t first = 0;  // members before it are done
    for (uint64_t off = 0; off < size;) {
      const size_t n = std::min<uint64_t>(buf.size(), size - off);
      RETURN_IF_ERROR(f.ReadExactly(off, n, buf.data()));
      crc = Crc32cExtend(crc, buf.data(), n);
      for (size_t i = first; i < members.size() && members[i]->offset < off + n; ++i) {
        RawMember& m = *members[i];
        const uint64_t begin = std::max(m.offset, off), end = std::min(m.offset + m.size, off + n);
        if (end > begin) m.crc32c = Crc32cExtend(m.crc32c, buf.data() + (begin - off), end - begin);
        if (m.offset + m.size <= off + n && i == first) ++first;
      }
      off += n;
    }
    *shard_crc = crc;
    return absl::OkStatus();
  }

  void Skip(ShardResult* r, const std::string& key, const std::string& reason,
            const std::string& detail) {
    ++r->skipped[reason];
    if (r->examples.size() < 8) {
      r->examples.push_back(absl::StrCat(rel_, ":", absl::CHexEscape(key), ": ", detail));
    }
  }

  // Reads enough of a member to parse its header (growing for JPEGs whose
  // frame header follows large metadata segments).
  template <typename Parse>
  auto ReadHeader(const RandomAccessFile& f, const RawMember& m, size_t first, Parse parse)
      -> decltype(parse(absl::string_view())) {
    size_t want = std::min<uint64_t>(m.size, first);
    while (true) {
      auto bytes = f.ReadString(m.offset, want);
      if (!bytes.ok()) return bytes.status();
      auto h = parse(*bytes);
      if (h.ok() || want >= m.size || want >= (4u << 20)) return h;
      want = std::min<uint64_t>(m.size, want * 16);
    }
  }

  void ScanSample(const RandomAccessFile& f, Group* g, ShardResult* r) {
    if (!g->bad_name.empty()) {
      return Skip(r, g->key, "bad_name",
                  absl::StrCat("member name '", g->bad_name,
                               "' is not valid UTF-8 (names travel in protobuf strings); rename it"));
    }
    SampleOut s;
    s.key = g->key;
    const RawMember* json = nullptr;
    const RawMember* txt = nullptr;
    std::vector<std::pair<const RawMember*, MemberKind>> media;
    absl::flat_hash_map<std::string, int> seen;
    for (const RawMember& m : g->members) {
      if (++seen[m.ext] > 1) {
        return Skip(r, g->key, "duplicate_member",
                    absl::StrCat("member ", g->key, ".", m.ext, " appears twice"));
      }
      const size_t dot = m.ext.rfind('.');
      const std::string last =
          absl::AsciiStrToLower(dot == std::string::npos ? m.ext : m.ext.substr(dot + 1));
      if (ImageKindFromExtension(last) != ImageKind::kUnknown) {
        media.emplace_back(&m, MemberKind::kJpeg);  // real kind from the magic bytes below
      } else if (last == "wav") {
        media.emplace_back(&m, MemberKind::kWav);
      } else if (m.ext == "json") {
        json = &m;
      } else if (m.ext == "txt") {
        txt = &m;
      } else {
        ++r->ignored;
      }
    }
    const size_t images = std::count_if(media.begin(), media.end(), [](const auto& m) {
      return m.second != MemberKind::kWav;
    });
    if (images > o_.max_images_per_sample) {
      return Skip(r, g->key, "too_many_images",
                  absl::StrCat(g->key, " has ", images, " images, over the limit (",
                               "--max-images-per-sample ", o_.max_images_per_sample, ")"));
    }
    std::sort(media.begin(), media.end(), [](const auto& a, const auto& b) {
      return MediaOrder(a.first->ext) < MediaOrder(b.first->ext);
    });
    for (auto& [m, kind] : media) {
      MemberInput in;
      in.ext = m->ext;
      in.offset = m->offset;
      in.size = m->size;
      in.has_crc32c = true;
      in.crc32c = m->crc32c;
      if (kind == MemberKind::kWav) {
        auto h = ReadHeader(f, *m, 4096, [](absl::string_view b) { return ReadWavHeader(b); });
        if (!h.ok()) {
          return Skip(r, g->key, "bad_audio_header",
                      absl::StrCat(g->key, ".", m->ext, ": ", h.status().message()));
        }
        in.kind = MemberKind::kWav;
        in.audio_ms = h->duration_ms;
      } else {
        auto h = ReadHeader(f, *m, 4096, [](absl::string_view b) { return ReadImageHeader(b); });
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
      auto bytes = f.ReadString(json->offset, json->size);
      if (!bytes.ok()) return Skip(r, g->key, "read_error", std::string(bytes.status().message()));
      std::vector<std::string> unknown;
      auto tokens = JsonTokenCount(*bytes, o_.bytes_per_token, o_.vocab_size, &unknown);
      if (!unknown.empty()) {
        ++r->unknown_json_members;
        for (const std::string& field : unknown) {
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
      if (tokens.status().code() == absl::StatusCode::kOutOfRange) {
        return Skip(r, g->key, "token_out_of_vocab",
                    absl::StrCat(g->key, ".json: ", tokens.status().message(),
                                 " (--vocab-size)"));
      }
      if (tokens.ok()) {
        s.text_tokens = *tokens;
        have_tokens = true;
        s.has_text = true;
        s.text = TextInput(MemberKind::kJson, "json", *json);
      } else if (tokens.status().code() != absl::StatusCode::kNotFound || txt == nullptr) {
        const bool missing = tokens.status().code() == absl::StatusCode::kNotFound;
        if (!missing || s.media.empty()) {
          return Skip(r, g->key, missing ? "no_token_count" : "bad_json",
                      absl::StrCat(g->key, ".json: ", tokens.status().message()));
        }
        // A VL sample whose JSON carries only metadata: no text tokens.
        s.has_text = true;
        have_tokens = true;
        s.text = TextInput(MemberKind::kJson, "json", *json);
      }
    }
    if (!have_tokens && txt != nullptr) {
      s.text_tokens = EstimateTextTokens(txt->size, o_.bytes_per_token);
      s.has_text = true;
      s.text = TextInput(MemberKind::kTxt, "txt", *txt);
    }
    if (!s.has_text && s.media.empty()) {
      return Skip(r, g->key, "no_usable_member",
                  absl::StrCat(g->key, " has no .json, .txt, image or .wav member"));
    }
    r->samples.push_back(std::move(s));
  }

  const IndexBuildOptions& o_;
  const std::string& rel_;
};

}  // namespace

absl::StatusOr<std::vector<std::string>> ListShards(const std::string& dir,
                                                    std::vector<std::string>* refused) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec || !fs::exists(st)) {
    return absl::NotFoundError(
        absl::StrCat("source directory ", dir,
                     " does not exist; pass the directory holding the .tar shards "
                     "with --source"));
  }
  if (!fs::is_directory(st)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, " is not a directory; --source takes the directory holding the shards"));
  }
  // Each shard is checked as the stager opens it: beneath the directory,
  // never through a symlink out of it, and a regular file.
  ASSIGN_OR_RETURN(std::unique_ptr<RootDir> root, RootDir::Open(dir));
  std::vector<std::string> out, left_out;
  fs::path base = fs::path(dir).lexically_normal();
  if (base.filename().empty()) base = base.parent_path();  // "data/" -> "data"
  fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec)
      return absl::PermissionDeniedError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
    const fs::path& p = it->path();
    // The name as found under `dir`, symbolic links not resolved: the
    // stager opens the same path under its --source.
    const std::string rel = p.lexically_normal().lexically_relative(base).generic_string();
    if (it->is_symlink(ec) && it->is_directory(ec)) {
      const int fd = root->Open(rel.c_str(), O_RDONLY | O_DIRECTORY);
      if (fd >= 0) {
        ::close(fd);
      } else {
        // Not walked: the stager would refuse every shard under it.
        it.disable_recursion_pending();
        if (fd == -EXDEV || fd == -ELOOP) {
          left_out.push_back(absl::StrCat(absl::CHexEscape(rel), ": ",
                                          root->OutsideError("directory", rel).message(),
                                          "; its shards are not indexed"));
        }
      }
      continue;
    }
    if (p.extension() != ".tar" || it->is_directory(ec)) continue;
    const int fd = root->Open(rel.c_str(), O_RDONLY | O_NONBLOCK);
    struct stat fst;
    if (fd == -EXDEV || fd == -ELOOP) {
      left_out.push_back(
          absl::StrCat(absl::CHexEscape(rel), ": ", root->OutsideError("shard", rel).message()));
    } else if (fd >= 0 && (::fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode))) {
      left_out.push_back(absl::StrCat(
          absl::CHexEscape(rel),
          ": not a regular file (a FIFO, socket or device); the stager refuses it too"));
    } else if (fd >= 0) {
      out.push_back(rel);
    }
    if (fd >= 0) ::close(fd);
  }
  std::sort(out.begin(), out.end());
  std::sort(left_out.begin(), left_out.end());
  if (out.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no .tar shards under ", dir,
        left_out.empty() ? ""
                         : absl::StrCat(" that the stager would open (", left_out.size(),
                                        " left out, e.g. ", left_out.front(), ")"),
        "; point --source at a WebDataset directory (write one with `tutti gen-dataset`)"));
  }
  if (refused != nullptr) *refused = std::move(left_out);
  return out;
}

absl::StatusOr<std::string> BuildIndex(
    const IndexBuildOptions& options, IndexBuildReport* report,
    const std::function<void(const IndexBuildProgress&)>& progress) {
  std::vector<std::string> refused;
  ASSIGN_OR_RETURN(std::vector<std::string> shards, ListShards(options.source_dir, &refused));
  IndexBuildReport local;
  IndexBuildReport& rep = report ? *report : local;
  rep = IndexBuildReport();
  rep.shards_total = static_cast<uint32_t>(shards.size() + refused.size());
  if (!refused.empty() && !options.skip_bad_shards) {
    return absl::PermissionDeniedError(
        absl::StrCat("shard ", refused.front(), " (", refused.size(),
                     " left out in all; pass --skip-bad-shards to index the other shards)"));
  }
  rep.bad_shards = refused;

  IndexBuildProgress prog;
  prog.shards_total = rep.shards_total;
  std::vector<std::string> paths;
  for (const auto& rel : shards) {
    paths.push_back((fs::path(options.source_dir) / rel).string());
    std::error_code ec;
    const auto sz = fs::file_size(paths.back(), ec);
    if (!ec) prog.bytes_total += sz;
  }

  IndexWriter writer;
  writer.SetSourceDir(fs::absolute(options.source_dir).lexically_normal().string());
  writer.AddMeta("builder", "tutti index");
  writer.AddMeta("vocab_size", absl::StrCat(options.vocab_size));
  std::mutex mu;
  std::map<size_t, ShardResult> done;  // finished out of order, not yet committed
  size_t next_commit = 0;
  absl::Status failure;
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};

  // Commits finished shards in shard order (called with mu held).
  auto commit = [&]() {
    while (failure.ok() && done.count(next_commit)) {
      ShardResult r = std::move(done[next_commit]);
      done.erase(next_commit);
      const std::string& rel = shards[next_commit];
      ++next_commit;
      if (!r.status.ok()) {
        const std::string why = std::string(r.status.message());
        if (!options.skip_bad_shards) {
          failure = absl::Status(r.status.code(),
                                 absl::StrCat("shard ", absl::CHexEscape(rel), " is unusable: ", why,
                                              " (re-copy or rebuild it, or pass --skip-bad-shards "
                                              "to index the other shards)"));
          stop = true;
          return;
        }
        rep.bad_shards.push_back(absl::StrCat(absl::CHexEscape(rel), ": ", why));
        continue;
      }
      absl::Status s = writer.AddShard(rel, r.size, r.crc32c);
      for (const SampleOut& o : r.samples) {
        if (!s.ok()) break;
        s = writer.AddSample(o.key, o.text_tokens, o.has_text ? &o.text : nullptr, o.media);
        if (o.media.empty())
          ++rep.text_samples;
        else
          ++rep.vl_samples;
        for (const auto& m : o.media) ++(m.kind == MemberKind::kWav ? rep.audio : rep.images);
      }
      if (!s.ok()) {
        failure = Annotate(s, absl::StrCat("shard ", rel));
        stop = true;
        return;
      }
      ++rep.shards_indexed;
      rep.samples += r.samples.size();
      rep.bytes += r.size;
      rep.ignored_members += r.ignored;
      for (const auto& [k, v] : r.skipped) rep.skipped[k] += v;
      for (const auto& [k, v] : r.skipped_members) rep.skipped_members[k] += v;
      for (auto& e : r.examples) {
        if (rep.skipped_examples.size() < 16) rep.skipped_examples.push_back(std::move(e));
      }
      rep.unknown_json_members += r.unknown_json_members;
      rep.unknown_json_other += r.unknown_json_other;
      for (const auto& [field, n] : r.unknown_json_fields) {
        auto it = rep.unknown_json_fields.find(field);
        if (it != rep.unknown_json_fields.end()) {
          it->second += n;
        } else if (rep.unknown_json_fields.size() < 32) {
          rep.unknown_json_fields.emplace(field, n);
        } else {
          rep.unknown_json_other += n;
        }
      }
    }
  };

  auto worker = [&]() {
    while (!stop) {
      const size_t i = next++;
      if (i >= shards.size()) return;
      ShardScanner scanner(options, shards[i]);
      ShardResult r = scanner.Scan(paths[i]);
      std::lock_guard<std::mutex> lock(mu);
      prog.shards_done++;
      prog.bytes_done += r.size;
      prog.samples += r.samples.size();
      done.emplace(i, std::move(r));
      commit();
      if (progress) progress(prog);
    }
  };
  const uint32_t n_threads =
      std::max<uint32_t>(1, std::min<uint32_t>(options.threads, shards.size()));
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < n_threads; ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  RETURN_IF_ERROR(failure);
  if (rep.samples == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable sample in ", options.source_dir, " (", rep.bad_shards.size(), " bad shards, ",
        rep.skipped.size(), " skip reasons); see the messages above"));
  }
  for (const auto& [k, v] : rep.skipped)
    writer.AddMeta(absl::StrCat("skipped.", k), absl::StrCat(v));
  writer.AddMeta("bad_shards", absl::StrCat(rep.bad_shards.size()));
  return writer.Finish();
}

}  // namespace tutti::packer
