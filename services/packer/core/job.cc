#include "services/packer/core/job.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/dtype.h"
#include "common/job_config.h"
#include "common/media_header.h"
#include "common/status.h"
#include "services/packer/core/sampler.h"

namespace tutti::packer {

absl::StatusOr<std::shared_ptr<const Job>> Job::Create(v1::JobConfig config,
                                                       std::shared_ptr<const Index> index,
                                                       const JobOptions& options) {
  if (index == nullptr) return absl::InvalidArgumentError("no index");
  std::shared_ptr<Job> job(new Job());
  job->config_ = std::move(config);
  job->index_ = std::move(index);
  RETURN_IF_ERROR(job->Init(options));
  return std::shared_ptr<const Job>(std::move(job));
}

absl::Status Job::Init(const JobOptions& options) {
  RETURN_IF_ERROR(ValidateJobConfig(config_));
  fingerprint_ = JobFingerprint(config_, index_->content_id());
  StrategyOptions so;
  so.name = config_.packing().strategy();
  so.open_bins = config_.packing().open_bins();
  so.improvement_rounds = config_.packing().improvement_rounds();
  ASSIGN_OR_RETURN(strategy_, MakeStrategy(so));
  ASSIGN_OR_RETURN(split_, SplitMicroBatches(config_.batch()));
  const auto& b = config_.batch();
  text_seqs_ = split_.text_micro_batches * b.text_micro_batch();
  vl_seqs_ = split_.vl_micro_batches * b.vl_micro_batch();
  const v1::VisionConfig& v = config_.vision();
  pixel_row_bytes_ = uint64_t{3} * v.temporal_patch() * v.patch_size() * v.patch_size() *
                     static_cast<uint32_t>(DTypeSize(v.output_dtype()));
  const v1::PostBalancingConfig& pb = config_.post_balancing();
  DispatcherOptions d;
  d.world_size = world_size();
  d.ranks_per_node = ranks_per_node();
  d.text_micro_batches = split_.text_micro_batches;
  d.text_micro_batch = b.text_micro_batch();
  d.vl_micro_batches = split_.vl_micro_batches;
  d.vl_micro_batch = b.vl_micro_batch();
  d.img_cap = b.img_cap_tokens();
  d.padded = pb.padded();
  d.rearrangement =
      pb.rearrangement() == "ilp" ? dispatch::Rearrangement::kIlp : dispatch::Rearrangement::kFast;
  d.hidden_size = pb.hidden_size();
  d.embedding_dtype_bytes = static_cast<uint32_t>(DTypeSize(pb.embedding_dtype()));
  d.node_aware = options.node_aware;
  d.balance_tolerance =
      pb.has_balance_tolerance() ? pb.balance_tolerance() : kDefaultBalanceTolerance;
  if (!(d.balance_tolerance >= 0 && d.balance_tolerance <= kMaxBalanceTolerance)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "post_balancing.balance_tolerance ", pb.balance_tolerance(), " is outside [0, ",
        kMaxBalanceTolerance, "]: it is the fraction by which a rank's phase cost may exceed the ",
        "phase's lower bound to save inter-node bytes, e.g. ", kDefaultBalanceTolerance,
        " (the default); leave it unset for the default"));
  }
  d.text_affinity = config_.locality().home_replication() == 0;
  dispatcher_options_ = d;
  if (pb.enabled() && d.rearrangement == dispatch::Rearrangement::kIlp) {
    const uint64_t binaries = IlpBinaries(d, b.text_samples_per_step(), b.vl_samples_per_step());
    if (binaries > kIlpMaxBinaries) {
      return absl::FailedPreconditionError(absl::StrCat(
          "post_balancing.rearrangement 'ilp' solves an integer program per step with ", binaries,
          " binary variables here (", b.text_samples_per_step() + b.vl_samples_per_step(),
          " samples x ", world_size(), " ranks x their sequences), above its limit of ",
          kIlpMaxBinaries,
          ": it is an exact reference for small jobs; use rearrangement 'fast' (within 1% of the "
          "optimum in tutti bench exchange), or fewer samples per step or ranks"));
    }
  }
  if (!pb.enabled()) {
    dispatcher_ = MakeColocatedDispatcher(strategy_.get(), d);
  } else if (options.post_balancing_peer.empty()) {
    dispatcher_ = MakePostBalancingDispatcher(d);
  } else {
    peer_ = MakePeerStrategy(options.post_balancing_peer);
    if (peer_ == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("the post-balancing peer '", options.post_balancing_peer,
                       "' is not one of lpt, kk, multipack, sequential"));
    }
    dispatcher_ = MakePeerRedealDispatcher(peer_.get(), d);
  }
  ASSIGN_OR_RETURN(overflow_, ResolveOverflowPolicy(config_.overflow()));
  if (config_.locality().home_replication() > 0) {
    ASSIGN_OR_RETURN(homes_,
                     HomeStaging::Create(config_, *index_, RemovalChanges(options.node_removals)));
  } else if (!options.node_removals.empty()) {
    return absl::InvalidArgumentError(
        "node removals re-home shards, but the job has no locality (locality.home_replication "
        "is 0): every node stages what its ranks' plans name");
  }
  fallback_strategy_ = MakeFirstFitStrategy();
  fallback_dispatcher_ = MakeColocatedDispatcher(fallback_strategy_.get(), d);

  const Index& ix = *index_;
  FilterStreams();
  if (config_.has_mixture()) {
    RETURN_IF_ERROR(InitMixture());
  } else {
    const uint64_t n_text = text_samples().size(), n_vl = vl_samples().size();
    struct StreamCheck {
      const char* name;
      const char* field;
      uint64_t per_step;
      uint64_t n;
    };
    for (const StreamCheck& c :
         {StreamCheck{"text-only", "text_samples_per_step", b.text_samples_per_step(), n_text},
          StreamCheck{"vision-language", "vl_samples_per_step", b.vl_samples_per_step(), n_vl}}) {
      if (c.per_step == 0) continue;
      if (c.n == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("batch.", c.field, " is ", c.per_step, " but the index ", ix.origin(),
                         " has no ", c.name, " samples", UnservableNote(), "; set batch.", c.field,
                         " to 0 or index a dataset that has them"));
      }
      if (c.n < 2 * uint64_t{c.per_step}) {
        return absl::FailedPreconditionError(
            absl::StrCat("batch.", c.field, " is ", c.per_step, " but the index ", ix.origin(),
                         " has only ", c.n, " ", c.name, " samples", UnservableNote(),
                         ", fewer than two steps draw (a step that spans an epoch boundary "
                         "must find its samples without repeats); lower batch.",
                         c.field, " to at most ", c.n / 2, " or index more ", c.name, " samples"));
      }
    }
    steps_per_epoch_ =
        StepsForEpochs(1, n_text, b.text_samples_per_step(), n_vl, b.vl_samples_per_step());
    total_steps_ = config_.epochs() == 0
                       ? 0
                       : StepsForEpochs(config_.epochs(), n_text, b.text_samples_per_step(), n_vl,
                                        b.vl_samples_per_step());
  }

  costers_.reserve(config_.curriculum_size());
  for (int i = 0; i < config_.curriculum_size(); ++i) {
    costers_.emplace_back(config_, ix, config_.curriculum(i).max_pixels(), Ceilings());
  }
  for (int i = 0; i < config_.curriculum_size(); ++i) {
    RETURN_IF_ERROR(CheckStage(static_cast<uint32_t>(i), options));
  }
  return absl::OkStatus();
}

absl::Status Job::InitMixture() {
  const auto& b = config_.batch();
  const absl::Span<const uint32_t> streams[2] = {text_samples_, vl_samples_};
  const uint32_t per[2] = {b.text_samples_per_step(), b.vl_samples_per_step()};
  ASSIGN_OR_RETURN(mixture_,
                   Mixture::Create(config_, *index_, streams, per, overflow_.long_documents));
  // Each stream's epoch: its sources' epochs; the slower stream's decides.
  steps_per_epoch_ = 0;
  total_steps_ = 0;
  for (const int vl : {0, 1}) {
    if (per[vl] == 0) continue;
    const uint64_t n = mixture_->epoch_samples(vl);
    steps_per_epoch_ = std::max(steps_per_epoch_, (n + per[vl] - 1) / per[vl]);
    if (config_.epochs() > 0) {
      total_steps_ = std::max(total_steps_, (config_.epochs() * n + per[vl] - 1) / per[vl]);
    }
  }
  return absl::OkStatus();
}

std::vector<MediaCeiling> Job::Ceilings() const {
  std::vector<MediaCeiling> out;
  if (!mixture_) return out;
  const Index& ix = *index_;
  for (uint32_t i = 0; i < mixture_->num_sources(); ++i) {
    const MixtureSource& src = mixture_->source(i);
    if (src.max_pixels == 0) continue;
    for (const auto& [first, end] : src.shards) {
      const IndexShard& last = ix.shard(end - 1);
      out.push_back(MediaCeiling{ix.media_begin(ix.shard(first).first_sample),
                                 ix.media_begin(last.first_sample + last.num_samples),
                                 src.max_pixels});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const MediaCeiling& a, const MediaCeiling& b) { return a.first < b.first; });
  return out;
}

std::string Job::source_name(uint32_t source) const {
  if (mixture_) return mixture_->source(source).name;
  return source == 0 ? "text" : "vl";
}

void Job::DrawSamples(bool vl, const uint64_t* pos, size_t count, uint32_t* sample,
                      uint8_t* source) const {
  if (mixture_) {
    mixture_->Draw(vl, pos, count, sample, source);
    return;
  }
  const auto& b = config_.batch();
  const absl::Span<const uint32_t> ids = vl ? vl_samples() : text_samples();
  StreamSampler sampler(config_.seed(), vl ? Stream::kVl : Stream::kText,
                        std::max<uint64_t>(ids.size(), 1),
                        vl ? b.vl_samples_per_step() : b.text_samples_per_step());
  thread_local std::vector<uint64_t> local;
  local.resize(count);
  sampler.AtMany(pos, count, local.data());
  for (size_t k = 0; k < count; ++k) {
    sample[k] = ids[local[k]];
    source[k] = vl ? 1 : 0;
  }
}

const char* Job::UnservableReason(uint32_t s) const {
  const Index& ix = *index_;
  const v1::VisionConfig& v = config_.vision();
  const uint64_t max_pixels = v.max_source_pixels() ? v.max_source_pixels() : 178956970;
  const uint64_t max_side = v.max_source_side() ? v.max_source_side() : 65500;
  uint32_t images = 0;
  for (uint32_t j = ix.media_begin(s); j < ix.media_end(s); ++j) {
    if (!ix.media_is_image(j)) continue;
    ++images;
    if (!WithinSourceLimits(ix.media_width(j), ix.media_height(j), max_pixels, max_side)) {
      return "image_too_large";
    }
  }
  if (images > MaxImagesPerSample(v)) return "too_many_images";
  if (ix.text_kind(s) == MemberKind::kTxt && ix.text_tokens(s) > 0) return "no_token_ids";
  return "";
}

void Job::FilterStreams() {
  const Index& ix = *index_;
  text_samples_ = ix.text_samples();
  vl_samples_ = ix.vl_samples();
  for (auto [all, kept, out] : {std::tuple{ix.text_samples(), &text_kept_, &text_samples_},
                                std::tuple{ix.vl_samples(), &vl_kept_, &vl_samples_}}) {
    size_t i = 0;
    while (i < all.size() && *UnservableReason(all[i]) == '\0') ++i;
    if (i == all.size()) continue;  // all servable: draw from the index's stream
    kept->assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(i));
    for (; i < all.size(); ++i) {
      const uint32_t s = all[i];
      const char* why = UnservableReason(s);
      if (*why == '\0') {
        kept->push_back(s);
        continue;
      }
      if (unservable_[why]++ == 0) unservable_examples_[why] = DescribeSample(s);
    }
    *out = *kept;
  }
}

std::string Job::UnservableNote() const {
  if (unservable_.empty()) return "";
  std::string note = " that the stager can serve (left out:";
  for (const auto& [why, n] : unservable_) absl::StrAppend(&note, " ", why, " ", n);
  return note + ")";
}

absl::Status Job::CheckStage(uint32_t i, const JobOptions& options) {
  const v1::CurriculumStage& stage = config_.curriculum(i);
  const Index& ix = *index_;
  const StageCoster& coster = costers_[i];
  const uint32_t seq_len = stage.seq_len();
  const uint32_t img_cap = config_.batch().img_cap_tokens();
  StageStats st;
  st.start_step = stage.start_step();
  st.max_pixels = stage.max_pixels();
  st.seq_len = seq_len;
  uint64_t over_cap = 0, max_cap_tokens = 0;
  int64_t first_cap = -1;
  uint32_t first_cap_tokens = 0;
  DocumentLayout doc;
  std::vector<DocPiece> pieces;
  // The samples in groups with one long-document policy each: the two
  // streams, or each source's part of each stream (what the streams draw:
  // a sample left out is never planned).
  struct Group {
    bool vl = false;
    int source = -1;  // mixture source; -1: the whole stream
    LongDocuments policy = LongDocuments::kSplit;
    uint64_t n = 0, skipped = 0;
    int64_t first_skip = -1;
    double tokens = 0, images = 0;
  };
  std::vector<Group> groups;
  if (mixture_) {
    for (uint32_t src = 0; src < mixture_->num_sources(); ++src) {
      for (const int vl : {0, 1}) {
        if (mixture_->source(src).part[vl].slot < 0) continue;
        groups.push_back(Group{vl == 1, static_cast<int>(src), long_documents(src)});
      }
    }
  } else {
    groups.push_back(Group{false, -1, overflow_.long_documents});
    groups.push_back(Group{true, -1, overflow_.long_documents});
  }
  for (Group& g : groups) {
    const absl::Span<const uint32_t> list = g.vl ? vl_samples() : text_samples();
    std::vector<std::pair<uint32_t, uint32_t>> ranges = {{0, static_cast<uint32_t>(list.size())}};
    if (g.source >= 0) ranges = mixture_->source(static_cast<uint32_t>(g.source)).part[g.vl].ranges;
    for (const auto& [lo, hi] : ranges) {
      for (uint32_t at = lo; at < hi; ++at) {
        const uint32_t s = list[at];
        auto c = coster.Cost(s);
        if (!c.ok()) {
          return absl::FailedPreconditionError(
              absl::StrCat("sample ", DescribeSample(s), " cannot be resized at curriculum[", i,
                           "]: ", c.status().message(),
                           "; raise vision.max_aspect_ratio or rebuild the index without it"));
        }
        ++g.n;
        st.max_tokens = std::max(st.max_tokens, c->llm_tokens);
        // What the sequences will hold of it: all of it, split or not;
        // seq_len truncated; nothing skipped.
        uint32_t tokens = c->llm_tokens, image_tokens = c->image_tokens;
        if (c->llm_tokens > seq_len) {
          ++st.long_documents;
          RETURN_IF_ERROR(DocumentRuns(coster, ix, s, &doc));
          const LongDocOutcome o =
              ShapeDocumentStream(c->text_tokens, doc, seq_len, g.policy, &pieces);
          if (o == LongDocOutcome::kSkipped) {
            if (g.skipped++ == 0) g.first_skip = s;
            ++st.skipped[g.vl];
            tokens = 0;
          }
          if (o == LongDocOutcome::kTruncated) {
            // Its kept prefix: the runs past the cut are dropped.
            tokens = pieces[0].tokens;
            image_tokens = 0;
            for (uint32_t r = 0; r < pieces[0].runs; ++r) {
              if (doc.medium[r] < doc.images) image_tokens += doc.runs[r] - 2;
            }
          }
        }
        g.tokens += tokens;
        if (tokens > 0) g.images += image_tokens;
        if (img_cap > 0 && c->image_tokens > img_cap) {
          if (first_cap < 0) first_cap = s, first_cap_tokens = c->image_tokens;
          max_cap_tokens = std::max<uint64_t>(max_cap_tokens, c->image_tokens);
          ++over_cap;
        }
      }
    }
  }
  const std::string where =
      absl::StrCat("curriculum[", i, "] (start_step ", stage.start_step(), ", max_pixels ",
                   stage.max_pixels(), ", seq_len ", seq_len, ")");
  for (const Group& g : groups) {
    const double fraction = g.n > 0 ? double(g.skipped) / g.n : 0;
    if (fraction <= overflow_.max_skip_fraction) continue;
    const std::string whose =
        g.source < 0 ? std::string(g.vl ? "vision-language" : "text-only")
                     : absl::StrCat(g.vl ? "VL" : "text-only", " samples of mixture source '",
                                    source_name(static_cast<uint32_t>(g.source)), "', whose");
    const std::string field = g.source < 0
                                  ? "overflow.long_documents"
                                  : absl::StrCat("mixture.sources[", g.source, "].long_documents");
    return absl::FailedPreconditionError(absl::StrFormat(
        "at %s %s '%s' would skip %u of the %u %s samples (%.4f, e.g. %s, "
        "longer than seq_len%s), above overflow.max_skip_fraction %.4f; raise curriculum[%u]."
        "seq_len to at least %u or lower its max_pixels, choose %s 'split' "
        "(it skips only a document with one image or audio run longer than seq_len), or raise "
        "overflow.max_skip_fraction to at least %.4f",
        where, field, LongDocumentsName(g.policy), g.skipped, g.n, whose, fraction,
        DescribeSample(static_cast<uint32_t>(g.first_skip)),
        g.policy == LongDocuments::kSkip ? "" : " in one image or audio run",
        overflow_.max_skip_fraction, i, st.max_tokens, field, fraction));
  }
  if (over_cap > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "batch.img_cap_tokens ", img_cap, " is smaller than the images of sample ",
        DescribeSample(first_cap), " (", first_cap_tokens, " image tokens at ", where, "; ",
        over_cap, " samples exceed the cap): raise batch.img_cap_tokens to at least ",
        max_cap_tokens, " or lower max_pixels"));
  }
  const auto& b = config_.batch();
  const uint64_t n_vl = vl_samples().size();
  // Mean tokens (and VL image tokens) of a drawn sample: over each stream,
  // or with a mixture the weighted mean of its sources' means at the
  // heaviest weights of the schedule.
  double mean_images = 0;
  if (!mixture_) {
    const uint64_t n_text = text_samples().size();
    st.mean_text_tokens = n_text ? groups[0].tokens / n_text : 0;
    st.mean_vl_tokens = n_vl ? groups[1].tokens / n_vl : 0;
    mean_images = n_vl ? (groups[0].images + groups[1].images) / n_vl : 0;
  } else {
    for (const int vl : {0, 1}) {
      st.source_mean_tokens[vl].assign(mixture_->num_sources(), 0);
      std::vector<double> images(mixture_->num_sources(), 0);
      for (const Group& g : groups) {
        if (g.vl != (vl == 1) || g.n == 0) continue;
        st.source_mean_tokens[vl][g.source] = g.tokens / g.n;
        images[g.source] = g.images / g.n;
      }
      double& mean = vl ? st.mean_vl_tokens : st.mean_text_tokens;
      for (const MixtureSegment& seg : mixture_->segments()) {
        double w = 0, tokens = 0, image_tokens = 0;
        for (uint32_t src : mixture_->stream_sources(vl)) {
          w += seg.weights[src];
          tokens += seg.weights[src] * st.source_mean_tokens[vl][src];
          image_tokens += seg.weights[src] * images[src];
        }
        if (w <= 0) continue;
        mean = std::max(mean, tokens / w);
        if (vl) mean_images = std::max(mean_images, image_tokens / w);
      }
    }
  }
  const double W = world_size();
  const double text_cap = W * text_seqs_ * seq_len, vl_cap = W * vl_seqs_ * seq_len;
  st.text_fill = text_cap > 0 ? b.text_samples_per_step() * st.mean_text_tokens / text_cap : 0;
  st.vl_fill = vl_cap > 0 ? b.vl_samples_per_step() * st.mean_vl_tokens / vl_cap : 0;
  struct Fill {
    const char* name;
    const char* field;
    double fill;
    uint32_t per_step;
    double mean;
    uint32_t seqs;
    double cap;
  };
  for (const Fill& f : {Fill{"text", "text_samples_per_step", st.text_fill,
                             b.text_samples_per_step(), st.mean_text_tokens, text_seqs_, text_cap},
                        Fill{"VL", "vl_samples_per_step", st.vl_fill, b.vl_samples_per_step(),
                             st.mean_vl_tokens, vl_seqs_, vl_cap}}) {
    if (f.fill <= options.max_expected_fill) continue;
    const uint64_t max_ok =
        f.mean > 0 ? static_cast<uint64_t>(std::floor(options.max_expected_fill * f.cap / f.mean))
                   : 0;
    return absl::FailedPreconditionError(absl::StrFormat(
        "at %s the %s sequences would be %.2f full on average (%u %s samples per step x %.0f mean "
        "tokens / (%u ranks x %u sequences x %u tokens)), above the limit %.2f; lower batch.%s to "
        "at most %u, raise seq_len, or give %s more micro-batches or sequences",
        where, f.name, f.fill, f.per_step, f.name, f.mean, world_size(), f.seqs, seq_len,
        options.max_expected_fill, f.field, max_ok, f.name));
  }
  if (img_cap > 0 && n_vl > 0 && vl_seqs_ > 0 && mean_images > 0) {
    // Image tokens against the cap, as tokens against seq_len above: a step
    // of average samples must leave its VL sequences room under the cap.
    const double image_cap = W * vl_seqs_ * img_cap;
    const double image_fill = b.vl_samples_per_step() * mean_images / image_cap;
    if (image_fill > options.max_expected_fill) {
      const uint64_t max_ok =
          static_cast<uint64_t>(std::floor(options.max_expected_fill * image_cap / mean_images));
      return absl::FailedPreconditionError(absl::StrFormat(
          "at %s the VL sequences' image tokens would be %.2f of batch.img_cap_tokens on average "
          "(%u VL samples per step x %.0f mean image tokens / (%u ranks x %u sequences x %u)), "
          "above the limit %.2f: no plan can keep the cap; lower batch.vl_samples_per_step to at "
          "most %u, raise batch.img_cap_tokens to at least %.0f, or give VL more micro-batches or "
          "sequences",
          where, image_fill, b.vl_samples_per_step(), mean_images, world_size(), vl_seqs_, img_cap,
          options.max_expected_fill, max_ok,
          std::ceil(b.vl_samples_per_step() * mean_images / (W * vl_seqs_) /
                    options.max_expected_fill)));
    }
  }
  stats_.push_back(st);
  return absl::OkStatus();
}

uint32_t Job::StageIndex(uint64_t step) const {
  uint32_t best = 0;
  for (int i = 0; i < config_.curriculum_size(); ++i) {
    if (config_.curriculum(i).start_step() <= step) best = static_cast<uint32_t>(i);
  }
  return best;
}

absl::Status Job::CheckStep(uint64_t step) const {
  const uint64_t per =
      std::max(config_.batch().text_samples_per_step(), config_.batch().vl_samples_per_step());
  if (per > 0 && step > (UINT64_MAX >> 1) / per) {
    return absl::OutOfRangeError(absl::StrCat("step ", step, " is out of range"));
  }
  if (total_steps_ > 0 && step >= total_steps_) {
    return absl::OutOfRangeError(
        absl::StrCat("step ", step, " is beyond the dataset's end: the job has ", total_steps_,
                     " steps (", config_.epochs(),
                     " epochs of its slower stream, each stream cycling on its own); ask for a "
                     "step below ",
                     total_steps_, ", or raise epochs in the job config (0 = unlimited)"));
  }
  return absl::OkStatus();
}

std::string Job::plan_strategy() const {
  if (!post_balancing()) return strategy_->name();
  if (peer_ != nullptr) return absl::StrCat("post-balancing/", peer_->name());
  return absl::StrCat("post-balancing/", config_.post_balancing().rearrangement());
}

std::string Job::DescribeSample(uint32_t sample) const {
  const Index& ix = *index_;
  return absl::StrCat("'", ix.key(sample), "' of shard ", ix.shard(ix.ShardOf(sample)).name);
}

}  // namespace tutti::packer
