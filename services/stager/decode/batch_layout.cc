#include "services/stager/decode/batch_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/sample_json.h"
#include "common/smart_resize.h"
#include "common/status.h"
#include "services/stager/decode/members.h"

namespace tutti::stager {
namespace {

constexpr uint64_t kAlign = 64;
uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

uint32_t AudioTokens(const v1::MemberRef& m, const v1::AudioConfig& a) {
  const uint32_t frames = (m.audio_ms() + 9) / 10;  // 10 ms frames
  const uint32_t fpt = std::max(1u, a.frames_per_token());
  return (frames + fpt - 1) / fpt;
}

}  // namespace

BatchLayout::Array& BatchLayout::Add(const std::string& name, v1::DType dtype,
                                     std::vector<uint64_t> shape, uint64_t elem) {
  Array a;
  a.name = name;
  a.dtype = dtype;
  a.shape = std::move(shape);
  uint64_t n = elem;
  for (uint64_t d : a.shape) n *= d;
  a.offset = total_;
  a.nbytes = n;
  total_ = AlignUp(total_ + n);
  arrays_.push_back(std::move(a));
  return arrays_.back();
}

const BatchLayout::Array& BatchLayout::Get(const std::string& name) const {
  for (const auto& a : arrays_) {
    if (a.name == name) return a;
  }
  static const Array kNone{};
  return kNone;
}

// The step's samples by id, each checked against the step's shard list.
class BatchLayout::PlanSamples {
 public:
  PlanSamples(const v1::StepPlan& step, const v1::RankPlan& rank)
      : step_(step), where_(absl::StrCat("plan of step ", step.step(), " rank ", rank.rank())) {
    for (const auto& s : step.samples()) samples_[s.sample_id()] = &s;
  }
  const std::string& where() const { return where_; }
  absl::StatusOr<const v1::SampleInfo*> Get(uint64_t id) const {
    auto it = samples_.find(id);
    if (it == samples_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where_, " names sample ", id, " but carries no SampleInfo for it; the packer sent an "
          "incomplete plan (ask it with this node's ranks)"));
    }
    if (it->second->shard() >= static_cast<uint32_t>(step_.shards_size())) {
      return absl::InvalidArgumentError(absl::StrCat(where_, ": sample ", id, " names shard ",
                                                     it->second->shard(), " of ", step_.shards_size()));
    }
    return it->second;
  }
  const v1::ShardRef& ShardOf(const v1::SampleInfo& s) const { return step_.shards(s.shard()); }

 private:
  const v1::StepPlan& step_;
  const std::string where_;
  std::map<uint64_t, const v1::SampleInfo*> samples_;
};

absl::StatusOr<BatchLayout> BatchLayout::Build(const v1::StepPlan& step, const v1::RankPlan& rank,
                                               const v1::JobConfig& config,
                                               const PatchifyParams& params) {
  BatchLayout L;
  L.vision_ = config.vision();
  L.audio_cfg_ = config.audio();
  L.params_ = params;
  const PlanSamples samples(step, rank);
  for (const auto& enc : rank.encoders()) {
    if (enc.encoder() == v1::ENCODER_VISION) {
      for (const auto& ip : enc.images()) RETURN_IF_ERROR(L.AddImage(ip, samples));
    } else if (enc.encoder() == v1::ENCODER_AUDIO) {
      for (const auto& ap : enc.audio()) RETURN_IF_ERROR(L.AddAudio(ap, samples));
    }
  }
  // Documents, in micro-batch then sequence order.
  VisionGeometryOptions geo = GeometryOptions(config, step.max_pixels() ? step.max_pixels()
                                                                       : config.vision().max_pixels());
  if (step.min_pixels()) geo.min_pixels = step.min_pixels();
  uint64_t tokens = 0;
  uint32_t seq_index = 0;
  for (const auto& mb : rank.micro_batches()) {
    L.mb_seqs_.push_back(static_cast<uint32_t>(mb.sequences_size()));
    for (const auto& seq : mb.sequences()) {
      L.seq_docs_.push_back(static_cast<uint32_t>(seq.docs_size()));
      for (const auto& slot : seq.docs()) {
        RETURN_IF_ERROR(L.AddDocument(slot, seq_index, rank.plan_version(), geo, samples, &tokens));
      }
      ++seq_index;
    }
  }
  L.PlaceArrays(tokens);
  return L;
}

absl::Status BatchLayout::AddImage(const v1::ImagePlan& ip, const PlanSamples& samples) {
  ASSIGN_OR_RETURN(const v1::SampleInfo* s, samples.Get(ip.sample_id()));
  if (ip.image_index() >= static_cast<uint32_t>(s->images_size())) {
    return absl::InvalidArgumentError(absl::StrCat(samples.where(), ": sample ", ip.sample_id(),
                                                   " has no image ", ip.image_index()));
  }
  const uint32_t factor = params_.patch * params_.merge;
  ImageItem it;
  it.sample_id = ip.sample_id();
  it.image_index = ip.image_index();
  it.member = s->images(ip.image_index());
  it.shard = samples.ShardOf(*s);
  it.height = ip.resized_height();
  it.width = ip.resized_width();
  if (it.height == 0 || it.width == 0 || it.height % factor || it.width % factor) {
    return absl::InvalidArgumentError(absl::StrCat(
        samples.where(), ": image ", ip.image_index(), " of sample ", ip.sample_id(),
        " is planned at ", it.width, "x", it.height, ", not a multiple of patch*merge = ", factor,
        "; the packer and this stager disagree on vision.patch_size/merge_size"));
  }
  it.grid_t = 1;
  it.grid_h = it.height / params_.patch;
  it.grid_w = it.width / params_.patch;
  it.rows = uint64_t{it.grid_h} * it.grid_w;
  it.bytes = it.rows * params_.row_values() * params_.value_bytes();
  it.llm_rank = ip.llm_rank();
  it.remote_load = ip.remote_load();
  if (ip.remote_load() && ip.has_holder_node()) it.holder = ip.holder_node();
  it.sample_images = static_cast<uint32_t>(s->images_size());
  images_.push_back(std::move(it));
  return absl::OkStatus();
}

absl::Status BatchLayout::AddAudio(const v1::AudioPlan& ap, const PlanSamples& samples) {
  ASSIGN_OR_RETURN(const v1::SampleInfo* s, samples.Get(ap.sample_id()));
  if (ap.audio_index() >= static_cast<uint32_t>(s->audio_size())) {
    return absl::InvalidArgumentError(absl::StrCat(samples.where(), ": sample ", ap.sample_id(),
                                                   " has no audio clip ", ap.audio_index()));
  }
  AudioItem a;
  a.sample_id = ap.sample_id();
  a.audio_index = ap.audio_index();
  a.member = s->audio(ap.audio_index());
  a.shard = samples.ShardOf(*s);
  if (ap.remote_load() && ap.has_holder_node()) a.holder = ap.holder_node();
  const uint64_t rate = audio_cfg_.sample_rate();
  a.samples = std::min<uint64_t>(a.member.audio_ms() * rate / 1000,
                                 uint64_t{audio_cfg_.max_seconds()} * rate);
  audio_.push_back(std::move(a));
  return absl::OkStatus();
}

// A document's encoder items and where its text goes. From plan_version 2
// on, the plan lists every document's images with their LLM tokens
// (DocSlot.images), and those are the layout: an image whose tokens differ
// from what this stager's vision config gives, or a total that is not the
// plan's encoder_tokens, is an error naming the sample. Older plans list
// only a split document's images: the tokens are computed here and
// reconciled with the plan's total.
absl::Status BatchLayout::AddDocument(const v1::DocSlot& slot, uint32_t sequence,
                                      uint32_t plan_version, const VisionGeometryOptions& geo,
                                      const PlanSamples& samples, uint64_t* tokens) {
  ASSIGN_OR_RETURN(const v1::SampleInfo* s, samples.Get(slot.sample_id()));
  DocItem d;
  d.sample_id = slot.sample_id();
  d.info = s;
  d.shard = samples.ShardOf(*s);
  if (slot.remote_load() && slot.has_holder_node()) d.holder = slot.holder_node();
  d.sequence = sequence;
  d.token_offset = *tokens;
  d.length = slot.length();
  std::vector<std::pair<uint32_t, bool>> enc;
  std::vector<uint32_t> index;  // each entry's image (audio clip) index
  // A mixture source's ceiling below the step's max_pixels sizes its images.
  VisionGeometryOptions own = geo;
  if (s->max_pixels() > 0 && s->max_pixels() < own.max_pixels) own.max_pixels = s->max_pixels();
  auto image_tokens = [&](const v1::MemberRef& m) {
    auto g = SmartResize(m.height(), m.width(), own);
    return g.ok() ? g->llm_tokens : 0;
  };
  const bool planned_images = plan_version >= 2;
  if (slot.pieces() > 0 || planned_images) {
    // The images the plan lists (a piece of a split document holds only
    // those); then its audio clips and its part of the text.
    for (const auto& di : slot.images()) {
      if (di.image_index() >= static_cast<uint32_t>(s->images_size())) {
        return absl::InvalidArgumentError(absl::StrCat(samples.where(), ": sample ",
                                                       slot.sample_id(), " has no image ",
                                                       di.image_index()));
      }
      const uint32_t computed = image_tokens(s->images(static_cast<int>(di.image_index())));
      index.push_back(di.image_index());
      if (!planned_images) {
        enc.emplace_back(computed, false);
        continue;
      }
      const uint64_t merge2 = uint64_t{params_.merge} * params_.merge;
      const uint64_t grid = uint64_t{std::max(di.grid_t(), 1u)} * di.grid_h() * di.grid_w();
      if (di.llm_tokens() != computed ||
          (merge2 > 0 && grid != uint64_t{di.llm_tokens()} * merge2)) {
        return absl::InvalidArgumentError(absl::StrCat(
            samples.where(), ": image ", di.image_index(), " of sample ", slot.sample_id(),
            " is planned in its document with ", di.llm_tokens(), " LLM tokens (grid ", di.grid_t(),
            "x", di.grid_h(), "x", di.grid_w(), ") but this stager's vision config gives ",
            computed, "; the packer and this stager disagree on the vision config"));
      }
      enc.emplace_back(di.llm_tokens(), false);
    }
  }
  // A piece, or (from plan_version 2 on) a truncated document: the audio
  // clips and the text the plan gives it.
  if (slot.pieces() > 0 || (slot.truncated() && planned_images)) {
    if (uint64_t{slot.first_audio()} + slot.audio_count() >
        static_cast<uint64_t>(s->audio_size())) {
      return absl::InvalidArgumentError(absl::StrCat(samples.where(), ": sample ",
                                                     slot.sample_id(), " has no audio clips ",
                                                     slot.first_audio(), "+", slot.audio_count()));
    }
    for (uint32_t a = slot.first_audio(); a < slot.first_audio() + slot.audio_count(); ++a) {
      enc.emplace_back(AudioTokens(s->audio(static_cast<int>(a)), audio_cfg_), true);
      index.push_back(a);
    }
    d.text_begin = slot.text_begin();
  } else {
    if (!planned_images) {
      for (const auto& m : s->images()) {
        index.push_back(static_cast<uint32_t>(enc.size()));
        enc.emplace_back(image_tokens(m), false);
      }
    }
    for (int a = 0; a < s->audio_size(); ++a) {
      enc.emplace_back(AudioTokens(s->audio(a), audio_cfg_), true);
      index.push_back(static_cast<uint32_t>(a));
    }
  }
  uint64_t sum = 0;
  for (const auto& e : enc) sum += e.first;
  if (planned_images && sum != slot.encoder_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(
        samples.where(), ": document of sample ", slot.sample_id(), " is planned with ",
        slot.encoder_tokens(), " encoder tokens but its planned images and its audio come to ", sum,
        "; the packer and this stager disagree on the vision or audio config"));
  }
  if (!enc.empty() && slot.encoder_tokens() != 0 && sum != slot.encoder_tokens()) {
    // The plan is authoritative: put the difference on the last item,
    // which cannot go below zero tokens.
    const int64_t diff = int64_t{slot.encoder_tokens()} - static_cast<int64_t>(sum);
    if (int64_t{enc.back().first} + diff < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          samples.where(), ": document of sample ", slot.sample_id(), " is planned with ",
          slot.encoder_tokens(), " encoder tokens but its images/audio need at least ",
          sum - enc.back().first,
          "; the packer and this stager disagree on the vision or audio config"));
    }
    enc.back().first = static_cast<uint32_t>(enc.back().first + diff);
    sum = slot.encoder_tokens();
  }
  const uint64_t prefix = sum + 2 * enc.size();
  if (prefix > d.length) {
    return absl::InvalidArgumentError(absl::StrCat(
        samples.where(), ": document of sample ", slot.sample_id(), " is planned with ", d.length,
        " tokens but its images/audio alone need ", prefix,
        "; the packer and this stager disagree on the vision or audio config"));
  }
  d.text_offset = static_cast<uint32_t>(prefix);
  d.text_length = static_cast<uint32_t>(d.length - prefix);
  d.piece = slot.pieces() > 0;
  d.image_begin = static_cast<uint32_t>(doc_images_);
  for (const auto& e : enc) d.image_count += e.second ? 0 : 1;
  doc_images_ += d.image_count;
  *tokens += d.length;
  docs_.push_back(d);
  doc_encoders_.push_back(std::move(enc));
  doc_media_.push_back(std::move(index));
  return absl::OkStatus();
}

// The segment's arrays, in order, and each image's and clip's place in them.
void BatchLayout::PlaceArrays(uint64_t tokens) {
  uint64_t rows = 0;
  for (const auto& im : images_) rows += im.rows;
  const uint64_t vb = params_.value_bytes();
  const v1::DType pix = params_.bf16 ? v1::DTYPE_BFLOAT16 : v1::DTYPE_FLOAT32;
  uint64_t off = Add("pixel_values", pix, {rows, params_.row_values()}, vb).offset;
  for (auto& im : images_) {
    im.offset = off;
    off += im.bytes;
  }
  const uint64_t n_img = images_.size(), n_doc = docs_.size();
  Add("image_grid_thw", v1::DTYPE_INT32, {n_img, 3}, 4);
  Add("image_sample_ids", v1::DTYPE_INT64, {n_img}, 8);
  Add("input_ids", v1::DTYPE_INT32, {tokens}, 4);
  Add("cu_seqlens", v1::DTYPE_INT32, {n_doc + 1}, 4);
  Add("seq_offsets", v1::DTYPE_INT32, {seq_docs_.size() + 1}, 4);
  Add("micro_batch_offsets", v1::DTYPE_INT32, {mb_seqs_.size() + 1}, 4);
  Add("doc_sample_ids", v1::DTYPE_INT64, {n_doc}, 8);
  Add("loss_mask", v1::DTYPE_UINT8, {tokens}, 1);
  Add("doc_image_starts", v1::DTYPE_INT32, {doc_images_}, 4);
  if (!audio_.empty()) {
    uint64_t total = 0;
    for (const auto& a : audio_) total += a.samples;
    uint64_t aoff = Add("audio_values", v1::DTYPE_FLOAT32, {total}, 4).offset;
    for (auto& a : audio_) {
      a.offset = aoff;
      aoff += a.samples * 4;
    }
    Add("audio_lengths", v1::DTYPE_INT32, {audio_.size()}, 4);
  }
}

void BatchLayout::WriteFixed(char* base) const {
  auto* grid = reinterpret_cast<int32_t*>(base + Get("image_grid_thw").offset);
  auto* ids = reinterpret_cast<int64_t*>(base + Get("image_sample_ids").offset);
  for (size_t i = 0; i < images_.size(); ++i) {
    grid[3 * i] = static_cast<int32_t>(images_[i].grid_t);
    grid[3 * i + 1] = static_cast<int32_t>(images_[i].grid_h);
    grid[3 * i + 2] = static_cast<int32_t>(images_[i].grid_w);
    ids[i] = static_cast<int64_t>(images_[i].sample_id);
  }
  auto* input = reinterpret_cast<int32_t*>(base + Get("input_ids").offset);
  auto* cu = reinterpret_cast<int32_t*>(base + Get("cu_seqlens").offset);
  auto* doc_ids = reinterpret_cast<int64_t*>(base + Get("doc_sample_ids").offset);
  auto* starts = reinterpret_cast<int32_t*>(base + Get("doc_image_starts").offset);
  const Array& loss = Get("loss_mask");
  std::memset(base + loss.offset, 1, loss.nbytes);
  cu[0] = 0;
  for (size_t d = 0; d < docs_.size(); ++d) {
    const DocItem& doc = docs_[d];
    int32_t* t = input + doc.token_offset;
    int32_t* start = starts + doc.image_begin;
    for (const auto& [n, is_audio] : doc_encoders_[d]) {
      if (!is_audio) *start++ = static_cast<int32_t>(t + 1 - (input + doc.token_offset));
      *t++ =
          static_cast<int32_t>(is_audio ? audio_cfg_.audio_start_id() : vision_.vision_start_id());
      const int32_t pad =
          static_cast<int32_t>(is_audio ? audio_cfg_.audio_pad_id() : vision_.image_pad_id());
      std::fill(t, t + n, pad);
      t += n;
      *t++ = static_cast<int32_t>(is_audio ? audio_cfg_.audio_end_id() : vision_.vision_end_id());
    }
    std::fill(t, input + doc.token_offset + doc.length, 0);
    cu[d + 1] = static_cast<int32_t>(doc.token_offset + doc.length);
    doc_ids[d] = static_cast<int64_t>(doc.sample_id);
  }
  auto* seq = reinterpret_cast<int32_t*>(base + Get("seq_offsets").offset);
  size_t d = 0;
  seq[0] = 0;
  for (size_t s = 0; s < seq_docs_.size(); ++s) {
    d += seq_docs_[s];
    seq[s + 1] = d == 0 ? 0 : cu[d];
  }
  auto* mb = reinterpret_cast<int32_t*>(base + Get("micro_batch_offsets").offset);
  mb[0] = 0;
  for (size_t m = 0; m < mb_seqs_.size(); ++m) mb[m + 1] = mb[m] + static_cast<int32_t>(mb_seqs_[m]);
  if (!audio_.empty()) {
    auto* len = reinterpret_cast<int32_t*>(base + Get("audio_lengths").offset);
    for (size_t i = 0; i < audio_.size(); ++i) len[i] = static_cast<int32_t>(audio_[i].samples);
  }
}

void BatchLayout::WriteText(char* base, size_t doc, const std::vector<int32_t>& tokens) const {
  const DocItem& d = docs_[doc];
  auto* input = reinterpret_cast<int32_t*>(base + Get("input_ids").offset);
  std::vector<int32_t> piece;
  if (d.text_begin > 0) {  // a later piece of a split document
    piece.assign(tokens.begin() + std::min<size_t>(d.text_begin, tokens.size()), tokens.end());
  }
  const std::vector<int32_t> fitted = FitTokens(d.text_begin > 0 ? piece : tokens, d.text_length);
  if (fitted.empty()) return;  // a document of markers only: no text to write
  std::memcpy(input + d.token_offset + d.text_offset, fitted.data(), fitted.size() * 4);
}

void BatchLayout::WriteDocument(char* base, size_t doc, const SampleJson& json) const {
  const DocItem& d = docs_[doc];
  const auto& enc = doc_encoders_[doc];
  const std::vector<int32_t>& ids = json.input_ids;
  // Per input_ids index: 0 text, 1 an image placeholder, 2 an audio one.
  std::vector<uint8_t> kind(ids.size(), 0);
  if (json.schema == 2) {
    for (uint32_t i : json.image_positions) kind[i] = 1;
    for (uint32_t i : json.audio_positions) kind[i] = 2;
  }
  std::vector<uint8_t> trained(ids.size(), json.has_trained ? 0 : 1);
  for (const auto& [b, e] : json.trained) std::fill(trained.begin() + b, trained.begin() + e, 1);
  std::vector<size_t> image_items, audio_items;  // indices into enc, in order
  for (size_t k = 0; k < enc.size(); ++k) (enc[k].second ? audio_items : image_items).push_back(k);
  auto* input = reinterpret_cast<int32_t*>(base + Get("input_ids").offset) + d.token_offset;
  auto* loss = reinterpret_cast<uint8_t*>(base + Get("loss_mask").offset) + d.token_offset;
  // In place: the part of k.json the plan gives the document (the whole of
  // it, a piece of a split one, a truncated one's prefix) is its text tokens
  // [text_begin, text_begin + text_length) and the placeholders of its
  // images and audio clips. Where those are one contiguous stretch of
  // input_ids holding every planned image and clip, and every run fits the
  // planned length, the stretch is written in order with each run where its
  // placeholder is.
  std::vector<uint64_t> run_at(ids.size(), 0);
  std::vector<uint8_t> held(ids.size(), 0);
  size_t first = ids.size(), last = 0;
  bool in_place = json.schema == 2 && !enc.empty();
  if (in_place) {
    const std::vector<uint32_t>& index = doc_media_[doc];
    std::vector<uint8_t> has_image(json.image_positions.size(), 0),
        has_audio(json.audio_positions.size(), 0);
    for (size_t k = 0; k < enc.size() && in_place; ++k) {
      std::vector<uint8_t>& has = enc[k].second ? has_audio : has_image;
      in_place = index[k] < has.size();
      if (in_place) has[index[k]] = 1;
    }
    uint32_t ti = 0, ii = 0, ai = 0;
    for (size_t i = 0; i < ids.size() && in_place; ++i) {
      if (kind[i] == 0) {
        held[i] = ti >= d.text_begin && ti - d.text_begin < d.text_length;
        ++ti;
      } else {
        held[i] = kind[i] == 1 ? has_image[ii++] : has_audio[ai++];
      }
      if (held[i]) first = std::min(first, i), last = i;
    }
  }
  if (in_place) {
    uint64_t p = 0;
    size_t ii = 0, ai = 0;
    for (size_t i = first; i <= last && in_place; ++i) {
      in_place = held[i] && p <= d.length;
      if (kind[i] == 0) {
        ++p;
        continue;
      }
      run_at[i] = p;
      p += enc[kind[i] == 1 ? image_items[ii++] : audio_items[ai++]].first + 2;
    }
    in_place = in_place && p <= d.length && ii == image_items.size() && ai == audio_items.size();
  }
  if (in_place) {
    auto* starts =
        reinterpret_cast<int32_t*>(base + Get("doc_image_starts").offset) + d.image_begin;
    uint64_t p = 0;
    size_t ii = 0, ai = 0;
    for (size_t i = first; i <= last; ++i) {
      if (kind[i] == 0) {
        input[p] = ids[i];
        loss[p++] = trained[i];
        continue;
      }
      const bool audio = kind[i] == 2;
      const uint32_t n = enc[audio ? audio_items[ai++] : image_items[ii++]].first;
      if (!audio) *starts++ = static_cast<int32_t>(run_at[i] + 1);
      input[p++] =
          static_cast<int32_t>(audio ? audio_cfg_.audio_start_id() : vision_.vision_start_id());
      std::fill(input + p, input + p + n,
                static_cast<int32_t>(audio ? audio_cfg_.audio_pad_id() : vision_.image_pad_id()));
      p += n;
      input[p++] =
          static_cast<int32_t>(audio ? audio_cfg_.audio_end_id() : vision_.vision_end_id());
      std::fill(loss + run_at[i], loss + p, 0);
    }
    // Shorter than planned (the member changed since indexing): zeros, untrained.
    std::fill(input + p, input + d.length, 0);
    std::fill(loss + p, loss + d.length, 0);
    return;
  }
  // Runs first (WriteFixed wrote them), then the text less its placeholders.
  std::vector<int32_t> text;
  std::vector<uint8_t> text_trained;
  text.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (kind[i] != 0) continue;
    text.push_back(ids[i]);
    text_trained.push_back(trained[i]);
  }
  WriteText(base, doc, text);
  if (!json.has_trained || d.text_length == 0 || text.empty()) return;
  // As WriteText fits the text: from text_begin, repeated to the length.
  const size_t from = d.text_begin > 0 ? std::min<size_t>(d.text_begin, text.size()) : 0;
  const size_t n = text.size() - from;
  for (uint32_t k = 0; k < d.text_length; ++k) {
    loss[d.text_offset + k] = n == 0 ? 0 : text_trained[from + k % n];
  }
}

std::vector<v1::ArrayDesc> BatchLayout::Finalize(char* base, const std::vector<bool>& image_dropped,
                                                 const std::vector<bool>& doc_dropped,
                                                 const std::vector<bool>& audio_dropped) const {
  std::vector<Array> out = arrays_;
  auto find = [&](const std::string& n) -> Array& {
    for (auto& a : out) {
      if (a.name == n) return a;
    }
    return out.front();
  };
  // Images.
  uint64_t dst = Get("pixel_values").offset, rows = 0;
  auto* grid = reinterpret_cast<int32_t*>(base + Get("image_grid_thw").offset);
  auto* ids = reinterpret_cast<int64_t*>(base + Get("image_sample_ids").offset);
  size_t kept = 0;
  for (size_t i = 0; i < images_.size(); ++i) {
    if (image_dropped[i]) continue;
    const ImageItem& im = images_[i];
    if (im.offset != dst) std::memmove(base + dst, base + im.offset, im.bytes);
    dst += im.bytes;
    rows += im.rows;
    std::memmove(grid + 3 * kept, grid + 3 * i, 12);
    ids[kept] = ids[i];
    ++kept;
  }
  Array& pv = find("pixel_values");
  pv.shape[0] = rows;
  pv.nbytes = rows * params_.row_values() * params_.value_bytes();
  find("image_grid_thw").shape[0] = kept;
  find("image_grid_thw").nbytes = kept * 12;
  find("image_sample_ids").shape[0] = kept;
  find("image_sample_ids").nbytes = kept * 8;
  // Documents.
  auto* input = reinterpret_cast<int32_t*>(base + Get("input_ids").offset);
  auto* cu = reinterpret_cast<int32_t*>(base + Get("cu_seqlens").offset);
  auto* doc_ids = reinterpret_cast<int64_t*>(base + Get("doc_sample_ids").offset);
  auto* seq = reinterpret_cast<int32_t*>(base + Get("seq_offsets").offset);
  auto* loss = reinterpret_cast<uint8_t*>(base + Get("loss_mask").offset);
  auto* starts = reinterpret_cast<int32_t*>(base + Get("doc_image_starts").offset);
  uint64_t tok = 0, kept_starts = 0;
  size_t kd = 0, d = 0;
  seq[0] = 0;
  for (size_t s = 0; s < seq_docs_.size(); ++s) {
    for (uint32_t k = 0; k < seq_docs_[s]; ++k, ++d) {
      if (doc_dropped[d]) continue;
      const DocItem& doc = docs_[d];
      if (doc.token_offset != tok) {
        std::memmove(input + tok, input + doc.token_offset, size_t{doc.length} * 4);
        std::memmove(loss + tok, loss + doc.token_offset, doc.length);
      }
      if (doc.image_begin != kept_starts) {
        std::memmove(starts + kept_starts, starts + doc.image_begin, size_t{doc.image_count} * 4);
      }
      kept_starts += doc.image_count;
      tok += doc.length;
      doc_ids[kd] = static_cast<int64_t>(doc.sample_id);
      cu[++kd] = static_cast<int32_t>(tok);
    }
    seq[s + 1] = static_cast<int32_t>(tok);
  }
  cu[0] = 0;
  find("input_ids").shape[0] = tok;
  find("input_ids").nbytes = tok * 4;
  find("loss_mask").shape[0] = tok;
  find("loss_mask").nbytes = tok;
  find("doc_image_starts").shape[0] = kept_starts;
  find("doc_image_starts").nbytes = kept_starts * 4;
  find("cu_seqlens").shape[0] = kd + 1;
  find("cu_seqlens").nbytes = (kd + 1) * 4;
  find("doc_sample_ids").shape[0] = kd;
  find("doc_sample_ids").nbytes = kd * 8;
  // Audio.
  if (!audio_.empty()) {
    uint64_t adst = Get("audio_values").offset, frames = 0;
    auto* lens = reinterpret_cast<int32_t*>(base + Get("audio_lengths").offset);
    size_t ka = 0;
    for (size_t a = 0; a < audio_.size(); ++a) {
      if (audio_dropped[a]) continue;
      const AudioItem& au = audio_[a];
      if (au.offset != adst) std::memmove(base + adst, base + au.offset, au.samples * 4);
      adst += au.samples * 4;
      frames += au.samples;
      lens[ka++] = lens[a];
    }
    find("audio_values").shape[0] = frames;
    find("audio_values").nbytes = frames * 4;
    find("audio_lengths").shape[0] = ka;
    find("audio_lengths").nbytes = ka * 4;
  }
  std::vector<v1::ArrayDesc> descs;
  for (const auto& a : out) {
    v1::ArrayDesc desc;
    desc.set_name(a.name);
    desc.set_dtype(a.dtype);
    for (uint64_t s : a.shape) desc.add_shape(s);
    desc.set_offset(a.offset);
    desc.set_nbytes(a.nbytes);
    descs.push_back(std::move(desc));
  }
  return descs;
}

}  // namespace tutti::stager
