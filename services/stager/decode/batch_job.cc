#include "services/stager/decode/batch_job.h"

#include <random>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include <opencv2/imgproc.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/job_config.h"
#include "common/log.h"
#include "common/status.h"
#include "services/stager/decode/members.h"
#include "services/stager/decode/skip.h"

namespace tutti::stager {
namespace {
const Logger kLog("stager.batch");
}  // namespace

// ------------------------------------------------------------ batch job
BatchJob::BatchJob(BuildContext ctx, std::shared_ptr<const v1::StepPlan> step, int rank_index,
                   std::string shm_name, Ready on_ready)
    : ctx_(std::move(ctx)), step_(std::move(step)), rank_index_(rank_index),
      shm_name_(std::move(shm_name)), on_ready_(std::move(on_ready)) {}

BatchJob::~BatchJob() {
  Discard();
  shm_.reset();
}

uint32_t BatchJob::rank() const { return step_->ranks(rank_index_).rank(); }

void BatchJob::Discard() {
  // Only the name goes now: reads and decodes still in flight write into the
  // mapping, which lives as long as the job (they hold a reference to it).
  if (shm_ && !discarded_.exchange(true)) ShmSegment::Unlink(shm_name_);
}

std::string BatchJob::Name(const v1::MemberRef& m, const v1::ShardRef& s) const {
  return absl::StrCat(s.name(), ":", m.name());
}

absl::Status BatchJob::Plan() {
  ASSIGN_OR_RETURN(layout_, BatchLayout::Build(*step_, step_->ranks(rank_index_), *ctx_.config,
                                               ctx_.params));
  return absl::OkStatus();
}

absl::Status BatchJob::Start() {
  started_ = absl::Now();
  auto seg = ShmSegment::Create(shm_name_, layout_.total_bytes(), ctx_.segment_access);
  // The daemon's names are its own (pid and nonce); should one be taken
  // anyway, another is picked rather than replacing someone's segment.
  const std::string base = shm_name_;
  for (int attempt = 1; absl::IsAlreadyExists(seg.status()) && attempt <= 3; ++attempt) {
    shm_name_ = absl::StrCat(base, "-", attempt, absl::Hex(std::random_device()() & 0xffff));
    seg = ShmSegment::Create(shm_name_, layout_.total_bytes(), ctx_.segment_access);
  }
  if (!seg.ok()) {
    return Annotate(seg.status(), absl::StrCat("cannot create the batch segment (", layout_.total_bytes(),
                                               " bytes); is /dev/shm full? lower --window or --memory_budget"));
  }
  shm_ = std::move(*seg);
  layout_.WriteFixed(shm_->data());
  for (size_t i = 0; i < layout_.images().size(); ++i) images_.push_back(std::make_unique<Item>());
  for (size_t i = 0; i < layout_.docs().size(); ++i) docs_.push_back(std::make_unique<Item>());
  for (size_t i = 0; i < layout_.audio().size(); ++i) audio_.push_back(std::make_unique<Item>());
  remaining_ = static_cast<int>(images_.size() + docs_.size() + audio_.size()) + 1;
  for (size_t i = 0; i < images_.size(); ++i) {
    if (absl::Status refused = CheckImageLimits(i); !refused.ok()) {
      Fail(*images_[i], refused);
    } else {
      ReadImage(i);
    }
  }
  for (size_t d = 0; d < docs_.size(); ++d) ReadDoc(d);
  for (size_t a = 0; a < audio_.size(); ++a) ReadAudio(a);
  Settle();  // the extra count keeps Finalize from running before every read was issued
  return absl::OkStatus();
}

void BatchJob::Fail(Item& item, const absl::Status& s) {
  {
    absl::MutexLock l(&item.mu);
    item.reason = SkipReason(s);
    item.detail = std::string(s.message());
    if (item.reason == "deadline") item.detail += DecodeBacklog();
  }
  item.state.store(kFailed);
  Settle();
}

// Reads a member and checks it against the index's checksum when the plan
// carries one: bytes that do not match, from the cache or the source, are
// read once more from the source; still wrong, the member fails with reason
// "checksum" (logged once per member, rate-limited) and is never decoded.
void BatchJob::ReadChecked(const v1::ShardRef& shard, const v1::MemberRef& member,
                           MemberReader::Done done) {
  auto self = shared_from_this();
  // Both live in the plan or the layout, which the batch keeps.
  const v1::ShardRef* s = &shard;
  const v1::MemberRef* m = &member;
  ctx_.reader->Read(
      shard, member.name(), member.offset(), member.size(), deadline(),
      [self, s, m, done = std::move(done)](absl::StatusOr<MemberReader::Bytes> bytes,
                                           bool from_cache) mutable {
        if (!bytes.ok() || !m->has_crc32c()) return done(std::move(bytes), from_cache);
        const uint32_t first = Crc32c(**bytes);
        if (first == m->crc32c()) return done(std::move(bytes), from_cache);
        if (StagerMetrics* metrics = self->ctx_.metrics) metrics->checksum_rereads.Increment();
        self->ctx_.reader->Read(
            *s, m->name(), m->offset(), m->size(), self->deadline(),
            [self, s, m, done = std::move(done), first, from_cache](
                absl::StatusOr<MemberReader::Bytes> again, bool) mutable {
              if (!again.ok()) return done(std::move(again), false);
              const uint32_t second = Crc32c(**again);
              if (second == m->crc32c()) return done(std::move(again), false);
              static LogRateLimit limit(absl::Seconds(10), 10);
              if (uint64_t suppressed = 0; limit.Allow(&suppressed)) {
                kLog.Warning("a member fails its checksum at the source: skipped, never decoded",
                             {{"shard", s->name()},
                              {"member", m->name()},
                              {"index_crc32c", absl::Hex(m->crc32c(), absl::kZeroPad8)},
                              {"first_read", from_cache ? "cache" : "source"},
                              {"first_crc32c", absl::Hex(first, absl::kZeroPad8)},
                              {"source_crc32c", absl::Hex(second, absl::kZeroPad8)},
                              {"suppressed", suppressed}});
              }
              done(ChecksumError(absl::StrCat(
                       s->name(), ":", m->name(), ": its bytes have CRC-32C ",
                       absl::Hex(second, absl::kZeroPad8), " but the index says ",
                       absl::Hex(m->crc32c(), absl::kZeroPad8),
                       "; it changed after indexing: re-copy the shard or re-index")),
                   false);
            },
            /*source_only=*/true);
      });
}

void BatchJob::ReadItem(const v1::ShardRef& shard, const v1::MemberRef& member,
                        std::optional<uint32_t> holder, MemberReader::Done done) {
  if (!holder || ctx_.peers == nullptr || !ctx_.peers->Knows(*holder)) {
    return ReadChecked(shard, member, std::move(done));
  }
  const absl::Time now = absl::Now();
  const absl::Duration left = deadline() - now;
  const absl::Duration share =
      ctx_.peer_timeout > absl::ZeroDuration() ? ctx_.peer_timeout : left / 2;
  auto self = shared_from_this();
  const v1::ShardRef* s = &shard;  // both live in the plan or the layout, which the batch keeps
  const v1::MemberRef* m = &member;
  ctx_.peers->Fetch(*holder, shard, member, std::min(deadline(), now + share),
                    [self, s, m, node = *holder,
                     done = std::move(done)](absl::StatusOr<MemberPeers::Bytes> bytes) mutable {
                      StagerMetrics* metrics = self->ctx_.metrics;
                      if (bytes.ok() && m->has_crc32c() && Crc32c(**bytes) != m->crc32c()) {
                        bytes = absl::DataLossError(absl::StrCat(
                            "its bytes have CRC-32C ", absl::Hex(Crc32c(**bytes), absl::kZeroPad8),
                            " but the index says ", absl::Hex(m->crc32c(), absl::kZeroPad8)));
                      } else if (bytes.ok() && (*bytes)->size() != m->size()) {
                        bytes = absl::DataLossError(
                            absl::StrCat("it sent ", (*bytes)->size(), " bytes, not ", m->size()));
                      }
                      if (bytes.ok()) {
                        if (metrics) metrics->peer_members_received.Increment();
                        return done(std::move(bytes), false);
                      }
                      if (metrics) metrics->peer_fallbacks.Increment();
                      static LogRateLimit limit(absl::Seconds(10), 10);
                      if (uint64_t suppressed = 0; limit.Allow(&suppressed)) {
                        kLog.Warning(
                            "a remote_load member did not come from its holder's stager: read from "
                            "the source",
                            {{"shard", s->name()},
                             {"member", m->name()},
                             {"holder_node", node},
                             {"error", bytes.status().ToString()},
                             {"suppressed", suppressed}});
                      }
                      self->ReadChecked(*s, *m, std::move(done));
                    });
}

// The job's bounds on a planned image that need no bytes: images per sample
// and planned pixels (the source's own size is checked from its header when
// it is decoded). The packer plans neither, so a refusal here means the plan
// and this stager disagree; each is counted by limit and skipped "too_large".
absl::Status BatchJob::CheckImageLimits(size_t i) {
  const ImageItem& im = layout_.images()[i];
  const v1::VisionConfig& v = ctx_.config->vision();
  const uint32_t max_images = MaxImagesPerSample(v);
  const uint64_t max_pixels = step_->max_pixels() ? step_->max_pixels() : v.max_pixels();
  const char* limit = nullptr;
  std::string why;
  if (im.sample_images > max_images) {
    limit = "images_per_sample";
    why = absl::StrCat("sample ", im.sample_id, " has ", im.sample_images,
                       " images, over the limit (vision.max_images_per_sample ", max_images, ")");
  } else if (uint64_t{im.height} * im.width > max_pixels) {
    limit = "image_pixels";
    why = absl::StrCat("image ", im.image_index, " of sample ", im.sample_id, " is planned at ",
                       im.width, "x", im.height, ", over the limit (the step's max_pixels ",
                       max_pixels, ")");
  } else {
    return absl::OkStatus();
  }
  if (ctx_.metrics) ctx_.metrics->LimitRefusals(limit).Increment();
  return absl::ResourceExhaustedError(
      absl::StrCat(Name(im.member, im.shard), ": ", why, "; refused without reading it"));
}

void BatchJob::ReadImage(size_t i) {
  const ImageItem& im = layout_.images()[i];
  // A remote_load image (its shard is staged on another node, not here)
  // comes from its holder's stager when the plan names one (ReadItem), else,
  // or when that fails, like any other: the reader goes to the source when
  // the shard is not in this node's cache.
  if (im.remote_load && ctx_.metrics) ctx_.metrics->remote_load_images.Increment();
  auto self = shared_from_this();
  ReadItem(
      im.shard, im.member, im.holder, [self, i](absl::StatusOr<MemberReader::Bytes> bytes, bool) {
        Item& it = *self->images_[i];
        int expect = kReading;
        if (!bytes.ok()) {
          if (it.state.compare_exchange_strong(expect, kDecoding)) self->Fail(it, bytes.status());
          return;
        }
        if (!it.state.compare_exchange_strong(expect, kQueued)) return;  // abandoned
        self->ctx_.pool->Submit(self->step(), [self, i, data = std::move(*bytes)] {
          self->DecodeImage(i, *data);
        });
      });
}

// On a decode thread.
void BatchJob::DecodeImage(size_t i, const std::string& data) {
  Item& it = *images_[i];
  int queued = kQueued;
  if (!it.state.compare_exchange_strong(queued, kDecoding)) return;
  if (discarded_.load()) {  // released or moved past: no one will read it
    return Fail(it, absl::CancelledError("batch discarded"));
  }
  const ImageItem& im = layout_.images()[i];
  const absl::Time t0 = absl::Now();
  auto info = DecodeImageInto(data, Name(im.member, im.shard),
                              static_cast<ImageKind>(im.member.format()), im.height, im.width,
                              ctx_.params, shm_->data() + im.offset);
  if (StagerMetrics* m = ctx_.metrics) {
    m->decode_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - t0));
    // Over vision.max_source_pixels / max_source_side (decode.h).
    if (absl::IsOutOfRange(info.status())) m->LimitRefusals("source_pixels").Increment();
    if (info.ok()) {
      m->decoded_images.Increment();
      if (info->reduce > 1) m->reduced_decodes.Increment();
      if (info->mislabelled) m->mislabelled_images.Increment();
    }
  }
  if (!info.ok()) return Fail(it, info.status());
  it.state.store(kDone);
  Settle();
}

void BatchJob::ReadDoc(size_t d) {
  const DocItem& doc = layout_.docs()[d];
  Item& item = *docs_[d];
  const v1::MemberRef& text = doc.info->text();
  if (doc.text_length == 0) {
    item.state.store(kDone);
    Settle();
    return;
  }
  if (text.name().empty() || !absl::EndsWith(text.name(), ".json")) {
    return Fail(item, absl::NotFoundError(absl::StrCat(
                          "sample ", doc.sample_id, " (", doc.info->key(),
                          ") has no k.json with input_ids", text.name().empty() ? "" : " (only ",
                          text.name(), text.name().empty() ? "" : ")", "; pre-tokenise the dataset")));
  }
  auto self = shared_from_this();
  ReadItem(doc.shard, text, doc.holder, [self, d](absl::StatusOr<MemberReader::Bytes> bytes, bool) {
    Item& it = *self->docs_[d];
    int expect = kReading;
    if (!it.state.compare_exchange_strong(expect, kDecoding)) return;
    if (!bytes.ok()) return self->Fail(it, bytes.status());
    const DocItem& doc2 = self->layout_.docs()[d];
    auto json = ParseTextMember(**bytes, *self->ctx_.config);
    if (!json.ok()) {
      return self->Fail(
          it, absl::DataLossError(absl::StrCat(self->Name(doc2.info->text(), doc2.shard), ": ",
                                               json.status().message())));
    }
    self->layout_.WriteDocument(self->shm_->data(), d, *json);
    {
      absl::MutexLock l(&it.mu);
      it.source = std::move(json->source);
      it.meta = std::move(json->meta);
    }
    it.state.store(kDone);
    self->Settle();
  });
}

void BatchJob::ReadAudio(size_t a) {
  const AudioItem& au = layout_.audio()[a];
  auto self = shared_from_this();
  ReadItem(
      au.shard, au.member, au.holder, [self, a](absl::StatusOr<MemberReader::Bytes> bytes, bool) {
        Item& it = *self->audio_[a];
        int expect = kReading;
        if (!it.state.compare_exchange_strong(expect, kDecoding)) return;
        if (!bytes.ok()) return self->Fail(it, bytes.status());
        const AudioItem& au2 = self->layout_.audio()[a];
        auto pcm = DecodeWav(**bytes, self->ctx_.config->audio().sample_rate(), au2.samples);
        if (!pcm.ok()) {
          return self->Fail(it, absl::DataLossError(absl::StrCat(self->Name(au2.member, au2.shard),
                                                                 ": ", pcm.status().message())));
        }
        if (!pcm->empty()) {
          std::memcpy(self->shm_->data() + au2.offset, pcm->data(), pcm->size() * 4);
        }
        it.state.store(kDone);
        self->Settle();
      });
}

std::string BatchJob::DecodeBacklog() const {
  const size_t queued = ctx_.pool ? ctx_.pool->queued() : 0;
  if (queued == 0) return "";
  return absl::StrCat(" (", queued, " image decodes were waiting for the ", ctx_.pool->size(),
                      " decode threads then)");
}

void BatchJob::Expire() {
  // The reader answers every read by the deadline; this is for one that
  // never came back (the member reader's own thread held up).
  auto give_up = [&](Item& it, const v1::ShardRef& shard, const v1::MemberRef& member) {
    int expect = kReading;
    if (!it.state.compare_exchange_strong(expect, kAbandoned)) return;
    {
      absl::MutexLock l(&it.mu);
      it.reason = "deadline";
      it.detail = absl::StrCat("shard ", shard.name(), " member ", member.name(),
                               ": waiting for I/O: the member reader had not answered ",
                               absl::FormatDuration(absl::Now() - started_),
                               " after the batch started (its deadline: ",
                               absl::FormatDuration(ctx_.deadline), ")", DecodeBacklog());
    }
    Settle();
  };
  for (size_t i = 0; i < images_.size(); ++i) {
    give_up(*images_[i], layout_.images()[i].shard, layout_.images()[i].member);
  }
  for (size_t d = 0; d < docs_.size(); ++d) {
    give_up(*docs_[d], layout_.docs()[d].shard, layout_.docs()[d].info->text());
  }
  for (size_t a = 0; a < audio_.size(); ++a) {
    give_up(*audio_[a], layout_.audio()[a].shard, layout_.audio()[a].member);
  }
}

void BatchJob::Settle() {
  if (remaining_.fetch_sub(1) == 1) Finalize();
}

std::string BatchJob::PendingSummary() const {
  int reading = 0, decoding = 0;
  std::string first;
  for (size_t i = 0; i < images_.size(); ++i) {
    const int s = images_[i]->state.load();
    if (s == kReading) {
      ++reading;
      if (first.empty()) first = Name(layout_.images()[i].member, layout_.images()[i].shard);
    }
    if (s == kQueued || s == kDecoding) ++decoding;
  }
  for (const auto& d : docs_) reading += d->state.load() == kReading;
  return absl::StrCat(reading, " member reads (e.g. ", first.empty() ? "-" : first, ") and ",
                      decoding, " image decodes of ", images_.size(), " images and ", docs_.size(),
                      " documents");
}

// What happened to each failed sample: one SkippedSample per failed member,
// and each sample counted once as dropped or placeholder. No sample's content
// ever stands in for another's: a caption is never paired with a foreign
// image (nor an image with a foreign caption).
class BatchJob::Outcome {
 public:
  Outcome(v1::BatchDescriptor* descriptor, StagerMetrics* metrics, LogRateLimit* log_limit,
          bool drop, Failures failures)
      : descriptor_(descriptor),
        metrics_(metrics),
        log_limit_(log_limit),
        drop_(drop),
        failures_(std::move(failures)) {}

  // Under the drop policy, a failed sample leaves the batch whole unless an
  // item of it crosses ranks.
  bool Dropped(uint64_t sample) const {
    return drop_ && failures_.failed.count(sample) && !failures_.crossing.count(sample);
  }
  enum Kind { kDropped, kPlaceholder };
  // A failed member `member` of `shard` in `sample`, and what became of the
  // sample (logged, rate-limited).
  void Skip(uint64_t sample, Item& item, Kind kind, absl::string_view what,
            const std::string& shard, const std::string& member) {
    absl::MutexLock l(&item.mu);
    v1::SkippedSample* s = descriptor_->add_skipped();
    s->set_sample_id(sample);
    s->set_reason(item.reason);
    s->set_detail(absl::StrCat(item.detail, what));
    s->set_action(kind == kDropped ? "dropped" : "placeholder");
    if (metrics_) metrics_->SkippedSamples(item.reason).Increment();
    static LogRateLimit process_limit(absl::Seconds(10), 10);
    LogRateLimit& limit = log_limit_ != nullptr ? *log_limit_ : process_limit;
    if (uint64_t suppressed = 0; limit.Allow(&suppressed)) {
      kLog.Warning("skipped a sample member",
                   {{"reason", item.reason}, {"shard", shard}, {"member", member},
                    {"sample", sample}, {"action", s->action()}, {"detail", s->detail()},
                    {"suppressed", suppressed}});
    }
  }
  void Count(uint64_t sample, Kind kind) {
    if (metrics_ == nullptr || !counted_.insert(sample).second) return;
    (kind == kDropped ? metrics_->dropped_samples : metrics_->placeholder_samples).Increment();
  }
  // The samples the batch names (kept or not), for its SampleInfo list.
  std::set<uint64_t>& named() { return named_; }

 private:
  v1::BatchDescriptor* descriptor_;
  StagerMetrics* metrics_;
  LogRateLimit* log_limit_;  // null: the process-wide one
  const bool drop_;
  const Failures failures_;
  std::set<uint64_t> counted_;
  std::set<uint64_t> named_;
};

BatchJob::Failures BatchJob::FindFailures() const {
  const uint32_t rank = step_->ranks(rank_index_).rank();
  const auto& images = layout_.images();
  const auto& docs = layout_.docs();
  const auto& audio = layout_.audio();
  Failures f;
  std::map<uint64_t, int> local_images, local_audio;
  for (size_t i = 0; i < images_.size(); ++i) {
    if (!images_[i]->done()) f.failed.insert(images[i].sample_id);
    if (images[i].llm_rank != rank) f.crossing.insert(images[i].sample_id);
    ++local_images[images[i].sample_id];
  }
  for (size_t a = 0; a < audio_.size(); ++a) {
    if (!audio_[a]->done()) f.failed.insert(audio[a].sample_id);
    ++local_audio[audio[a].sample_id];
  }
  for (size_t d = 0; d < docs_.size(); ++d) {
    const uint64_t id = docs[d].sample_id;
    if (!docs_[d]->done()) f.failed.insert(id);
    const v1::SampleInfo* info = docs[d].info;
    if (local_images[id] != info->images_size() || local_audio[id] != info->audio_size()) {
      f.crossing.insert(id);  // its encoder outputs come from another rank
    }
  }
  return f;
}

void BatchJob::SettleImages(Outcome& out, std::vector<bool>* dropped) {
  const auto& images = layout_.images();
  for (size_t i = 0; i < images_.size(); ++i) {
    const ImageItem& im = images[i];
    Item& item = *images_[i];
    out.named().insert(im.sample_id);
    if (out.Dropped(im.sample_id)) {
      (*dropped)[i] = true;
      if (!item.done()) {
        out.Skip(im.sample_id, item, Outcome::kDropped, " (sample dropped)", im.shard.name(),
                 im.member.name());
      }
      out.Count(im.sample_id, Outcome::kDropped);
      continue;
    }
    if (item.done()) continue;
    // The mean colour (all zeros once normalised) keeps the planned shape;
    // the sample's documents must carry no training signal (skipped says so).
    std::memset(shm_->data() + im.offset, 0, im.bytes);
    out.Skip(im.sample_id, item, Outcome::kPlaceholder,
             " (placeholder of the mean colour; mask the sample's tokens out of the loss)",
             im.shard.name(), im.member.name());
    out.Count(im.sample_id, Outcome::kPlaceholder);
  }
}

void BatchJob::SettleDocs(Outcome& out, std::vector<bool>* dropped) {
  const auto& docs = layout_.docs();
  for (size_t d = 0; d < docs_.size(); ++d) {
    const DocItem& doc = docs[d];
    Item& item = *docs_[d];
    out.named().insert(doc.sample_id);
    if (out.Dropped(doc.sample_id)) {
      (*dropped)[d] = true;
      if (!item.done()) {
        out.Skip(doc.sample_id, item, Outcome::kDropped, " (sample dropped)", doc.shard.name(),
                 doc.info->text().name());
      }
      out.Count(doc.sample_id, Outcome::kDropped);
      continue;
    }
    if (item.done()) continue;
    out.Skip(doc.sample_id, item, Outcome::kPlaceholder,
             " (placeholder tokens 0; mask the document out of the loss)", doc.shard.name(),
             doc.info->text().name());
    out.Count(doc.sample_id, Outcome::kPlaceholder);
    layout_.WriteText(shm_->data(), d, {});
  }
}

void BatchJob::SettleAudio(Outcome& out, std::vector<bool>* dropped) {
  const auto& audio = layout_.audio();
  for (size_t a = 0; a < audio_.size(); ++a) {
    const AudioItem& au = audio[a];
    Item& item = *audio_[a];
    out.named().insert(au.sample_id);
    if (out.Dropped(au.sample_id)) {
      (*dropped)[a] = true;
      if (!item.done()) {
        out.Skip(au.sample_id, item, Outcome::kDropped, " (sample dropped)", au.shard.name(),
                 au.member.name());
      }
      out.Count(au.sample_id, Outcome::kDropped);
      continue;
    }
    if (item.done()) continue;
    std::memset(shm_->data() + au.offset, 0, au.samples * 4);  // silence keeps the shape
    out.Skip(au.sample_id, item, Outcome::kPlaceholder,
             " (placeholder: silence; mask the sample's tokens out of the loss)", au.shard.name(),
             au.member.name());
    out.Count(au.sample_id, Outcome::kPlaceholder);
  }
}

void BatchJob::Describe(const std::vector<bool>& image_dropped,
                        const std::vector<bool>& doc_dropped,
                        const std::vector<bool>& audio_dropped, const std::set<uint64_t>& named) {
  const v1::RankPlan& rank = step_->ranks(rank_index_);
  descriptor_.set_step(step_->step());
  descriptor_.set_rank(rank.rank());
  descriptor_.set_shm_name(shm_name_);
  descriptor_.set_shm_size(layout_.total_bytes());
  for (auto& a : layout_.Finalize(shm_->data(), image_dropped, doc_dropped, audio_dropped)) {
    *descriptor_.add_arrays() = std::move(a);
  }
  *descriptor_.mutable_plan() = rank;
  // Each sample's k.json source and meta, from the first of its documents read here.
  std::map<uint64_t, std::pair<std::string, std::string>> text;
  for (size_t d = 0; d < docs_.size(); ++d) {
    Item& item = *docs_[d];
    if (!item.done() || doc_dropped[d]) continue;
    absl::MutexLock l(&item.mu);
    text.try_emplace(layout_.docs()[d].sample_id, item.source, item.meta);
  }
  for (const auto& s : step_->samples()) {
    if (!named.count(s.sample_id())) continue;
    v1::SampleInfo* info = descriptor_.add_samples();
    *info = s;
    if (auto it = text.find(s.sample_id()); it != text.end()) {
      info->set_sample_source(it->second.first);
      info->set_sample_meta(it->second.second);
    }
  }
  descriptor_.set_max_pixels(step_->max_pixels());
  descriptor_.set_seq_len(step_->seq_len());
}

void BatchJob::Finalize() {
  if (finalized_.exchange(true)) return;
  // Every item has settled (remaining_ reached 0): no other thread writes them now.
  Outcome out(&descriptor_, ctx_.metrics, ctx_.skip_log, ctx_.policy == v1::SKIP_POLICY_DROP,
              FindFailures());
  std::vector<bool> image_dropped(images_.size(), false), doc_dropped(docs_.size(), false),
      audio_dropped(audio_.size(), false);
  SettleImages(out, &image_dropped);
  SettleDocs(out, &doc_dropped);
  SettleAudio(out, &audio_dropped);
  Describe(image_dropped, doc_dropped, audio_dropped, out.named());
  auto self = shared_from_this();
  if (on_ready_) on_ready_(self);
}

}  // namespace tutti::stager
