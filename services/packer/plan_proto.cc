#include "services/packer/plan_proto.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"

namespace tutti::packer {
namespace {

v1::ImageFormat FormatOf(MemberKind k) {
  switch (k) {
    case MemberKind::kJpeg:
      return v1::IMAGE_FORMAT_JPEG;
    case MemberKind::kPng:
      return v1::IMAGE_FORMAT_PNG;
    case MemberKind::kWebp:
      return v1::IMAGE_FORMAT_WEBP;
    default:
      return v1::IMAGE_FORMAT_UNSPECIFIED;
  }
}

void FillPhase(const char* name, const PhaseSummary& s, v1::PhaseStats* out) {
  out->set_phase(name);
  out->set_max(s.max);
  out->set_mean(s.mean);
  out->set_imbalance(s.imbalance);
  out->set_lower_bound(s.lower_bound);
  out->set_imbalance_before(s.imbalance_before);
}

class PlanBuilder {
 public:
  PlanBuilder(const Job& job, const StepPlanData& d, v1::StepPlan* plan)
      : job_(job), ix_(job.index()), d_(d), plan_(plan) {}

  void Build(absl::Span<const uint32_t> ranks) {
    const v1::JobConfig& cfg = job_.config();
    plan_->Clear();
    plan_->set_step(d_.step);
    plan_->set_seed(cfg.seed());
    plan_->set_epoch(d_.epoch);
    plan_->set_text_epoch(d_.text_epoch);
    plan_->set_vl_epoch(d_.vl_epoch);
    plan_->set_world_size(d_.world_size);
    plan_->set_ranks_per_node(d_.ranks_per_node);
    plan_->set_max_pixels(d_.max_pixels);
    plan_->set_seq_len(d_.seq_len);
    plan_->set_min_pixels(cfg.vision().min_pixels());
    plan_->set_strategy(job_.plan_strategy());
    plan_->set_config_fingerprint(job_.fingerprint());
    if (d_.cost_fit > 0) {
      v1::CostFit* f = plan_->mutable_cost_fit();
      f->set_id(d_.cost_fit);
      f->set_from_step(d_.cost_fit_from);
      f->set_vit_linear(d_.cost.vit_linear);
      f->set_vit_quadratic(d_.cost.vit_quadratic);
      f->set_llm_linear(d_.cost.llm_linear);
      f->set_llm_quadratic(d_.cost.llm_quadratic);
      f->set_audio_linear(d_.cost.audio_linear);
      f->set_audio_quadratic(d_.cost.audio_quadratic);
    }

    // Samples the returned ranks touch, in batch order. Collected sparsely:
    // a step holds tens of thousands of samples and one rank touches a few
    // dozen, and every GetPlan of every rank comes through here.
    thread_local std::vector<uint32_t> touched;
    touched.clear();
    const uint32_t W = d_.world_size, S = d_.seqs_per_rank();
    for (uint32_t r : ranks) {
      for (uint32_t g = r * S; g < (r + 1) * S; ++g) {
        for (uint32_t k = d_.docs.begin[g]; k < d_.docs.begin[g + 1]; ++k) {
          touched.push_back(d_.docs.items[k]);
        }
      }
      for (uint32_t k = 0; k < d_.enc_images.size(r); ++k) {
        touched.push_back(d_.images[d_.enc_images.row(r)[k]].owner);
      }
      for (uint32_t k = 0; k < d_.enc_audio.size(r); ++k) {
        touched.push_back(d_.audio[d_.enc_audio.row(r)[k]].owner);
      }
      for (uint32_t k = r; k < d_.samples.size(); k += W) touched.push_back(k);
      // Inputs it loads for another node's ranks: it needs their members.
      if (!d_.load_sends.begin.empty()) {
        for (uint32_t k = 0; k < d_.load_sends.size(r); ++k) {
          touched.push_back(d_.LoadOwner(d_.load_sends.row(r)[k]));
        }
      }
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    thread_local std::vector<int32_t> shard_pos;
    if (shard_pos.size() != ix_.num_shards()) shard_pos.assign(ix_.num_shards(), -1);
    shard_pos_ = &shard_pos;
    for (uint32_t k : touched) AddSample(k);
    for (uint32_t r : ranks) AddRank(r);
    AddHeldShards(ranks);
    // Back to all -1 for the next plan built on this thread.
    for (uint32_t shard : used_shards_) shard_pos[shard] = -1;

    v1::PlanStats* stats = plan_->mutable_stats();
    FillPhase("vit", d_.vit, stats->add_phases());
    if (d_.has_audio) FillPhase("audio", d_.audio_phase, stats->add_phases());
    FillPhase("llm", d_.llm, stats->add_phases());
    stats->set_inter_node_bytes(d_.inter_node_bytes);
    stats->set_intra_node_bytes(d_.intra_node_bytes);
    stats->set_remote_load_bytes(d_.remote_load_bytes);
    if (const OverflowCounts& o = d_.overflow; o.any()) {
      v1::OverflowStats* os = stats->mutable_overflow();
      os->set_deferred_in(o.deferred_in);
      os->set_deferred_out(o.deferred_out);
      os->set_split_documents(o.split_documents);
      os->set_split_pieces(o.split_pieces);
      os->set_truncated(o.truncated);
      os->set_skipped(o.skipped);
      os->set_oldest_deferred_step(o.oldest_deferred_step);
      os->set_fallback_packing(o.fallback_packing);
    }
  }

 private:
  void FillShardRef(uint32_t shard, v1::ShardRef* ref) const {
    const IndexShard& s = ix_.shard(shard);
    ref->set_name(s.name);
    ref->set_size(s.size);
    ref->set_crc32c(s.crc32c);
    if (const HomeStaging* homes = job_.homes(); homes != nullptr) {
      for (uint32_t n : homes->HomesAt(d_.step).Homes(shard)) ref->add_home_nodes(n);
    }
  }
  // With locality: the shards the whole step reads whose homes include a
  // node of `ranks` (StepPlan.held_shards), in the step's first-use order.
  void AddHeldShards(absl::Span<const uint32_t> ranks) {
    const HomeStaging* homes = job_.homes();
    if (homes == nullptr || ranks.empty()) return;
    const uint32_t rpn = std::max<uint32_t>(1, d_.ranks_per_node);
    // `ranks` is sorted, so its nodes are too.
    thread_local std::vector<uint32_t> nodes;
    nodes.clear();
    for (uint32_t r : ranks) {
      if (nodes.empty() || nodes.back() != r / rpn) nodes.push_back(r / rpn);
    }
    const ShardHomes& at = homes->HomesAt(d_.step);
    for (uint32_t shard : d_.step_shards) {
      for (uint32_t n : at.Homes(shard)) {
        if (std::binary_search(nodes.begin(), nodes.end(), n)) {
          FillShardRef(shard, plan_->add_held_shards());
          break;
        }
      }
    }
  }
  uint32_t ShardRef(uint32_t shard) {
    std::vector<int32_t>& shard_pos = *shard_pos_;
    if (shard_pos[shard] < 0) {
      shard_pos[shard] = plan_->shards_size();
      used_shards_.push_back(shard);
      FillShardRef(shard, plan_->add_shards());
    }
    return static_cast<uint32_t>(shard_pos[shard]);
  }
  void AddSample(uint32_t k) {
    const PlannedSample& ps = d_.samples[k];
    const uint32_t s = ps.sample;
    v1::SampleInfo* info = plan_->add_samples();
    info->set_sample_id(s);
    info->set_shard(ShardRef(ix_.ShardOf(s)));
    info->set_key(std::string(ix_.key(s)));
    info->set_modality(ps.vl ? v1::MODALITY_VL : v1::MODALITY_TEXT);
    if (ix_.text_kind(s) != MemberKind::kNone) {
      v1::MemberRef* t = info->mutable_text();
      t->set_name(ix_.MemberName(s, ix_.text_ext(s)));
      t->set_offset(ix_.text_offset(s));
      t->set_size(ix_.text_size(s));
      if (ix_.has_member_crc32c()) t->set_crc32c(ix_.text_crc32c(s));
    }
    for (uint32_t j = ix_.media_begin(s); j < ix_.media_end(s); ++j) {
      const MediaView m = ix_.media(j);
      v1::MemberRef* ref = IsImage(m.kind) ? info->add_images() : info->add_audio();
      ref->set_name(ix_.MemberName(s, m.ext));
      ref->set_offset(m.offset);
      ref->set_size(m.size);
      if (ix_.has_member_crc32c()) ref->set_crc32c(ix_.media_crc32c(j));
      if (IsImage(m.kind)) {
        ref->set_format(FormatOf(m.kind));
        ref->set_width(m.width);
        ref->set_height(m.height);
      } else {
        ref->set_audio_ms(m.audio_ms);
      }
    }
    info->set_text_tokens(ps.cost.text_tokens);
    info->set_llm_tokens(ps.cost.llm_tokens);
    info->set_vit_cost(ps.cost.vit);
    info->set_llm_cost(ps.cost.llm);
    info->set_audio_cost(ps.cost.audio_cost);
    info->set_drawn_rank(ps.drawn_rank);
    if (const Mixture* m = job_.mixture()) {
      info->set_source(ps.source);
      const uint64_t ceiling = m->source(ps.source).max_pixels;
      if (ceiling > 0 && ceiling < d_.max_pixels) info->set_max_pixels(ceiling);
    }
  }

  void AddRank(uint32_t r) {
    const v1::JobConfig& cfg = job_.config();
    const uint32_t S = d_.seqs_per_rank();
    const uint32_t rpn = std::max<uint32_t>(1, d_.ranks_per_node);
    // With locality a remote load names the node whose stager holds its
    // shard: the load source's (a home node of the shard).
    const bool locality = cfg.locality().home_replication() > 0;
    v1::RankPlan* rp = plan_->add_ranks();
    rp->set_rank(r);
    rp->set_node(r / rpn);
    rp->set_plan_version(kPlanVersion);
    // LLM phase: text micro-batches first, then VL.
    const MicroBatchSplit& split = job_.split();
    const uint32_t tmb = cfg.batch().text_micro_batch(), vmb = cfg.batch().vl_micro_batch();
    auto add_mb = [&](v1::Modality modality, uint32_t first_seq, uint32_t n) {
      v1::MicroBatch* mb = rp->add_micro_batches();
      mb->set_modality(modality);
      for (uint32_t q = 0; q < n; ++q) {
        const uint32_t g = r * S + first_seq + q;
        v1::Sequence* seq = mb->add_sequences();
        uint32_t offset = 0, image_tokens = 0;
        for (uint32_t k = d_.docs.begin[g]; k < d_.docs.begin[g + 1]; ++k) {
          const PlannedSample& ps = d_.samples[d_.docs.items[k]];
          v1::DocSlot* doc = seq->add_docs();
          doc->set_sample_id(ps.sample);
          doc->set_offset(offset);
          doc->set_length(ps.cost.llm_tokens);
          doc->set_encoder_tokens(ps.cost.image_tokens + ps.cost.audio_tokens);
          doc->set_remote_load(ps.text_remote);
          if (locality && ps.text_remote) doc->set_holder_node(ps.text_source / rpn);
          if (ps.pieces > 0 || ps.truncated) {
            // A piece, or a truncated document: the images listed below, the
            // audio clips and the text it holds.
            doc->set_piece(ps.piece);
            doc->set_pieces(ps.pieces);
            doc->set_audio_count(ps.cost.audio);
            if (ps.cost.audio > 0) doc->set_first_audio(d_.audio[ps.first_audio].audio_index);
            doc->set_text_begin(ps.text_begin);
          }
          if (ps.truncated) doc->set_truncated(true);
          for (uint32_t i = ps.first_image; i < ps.first_image + ps.cost.images; ++i) {
            const PlannedImage& im = d_.images[i];
            v1::DocImage* di = doc->add_images();
            di->set_image_index(im.image_index);
            di->set_grid_t(1);
            di->set_grid_h(im.grid_h);
            di->set_grid_w(im.grid_w);
            di->set_llm_tokens(im.llm_tokens);
          }
          offset += ps.cost.llm_tokens;
          image_tokens += ps.cost.image_tokens;
        }
        seq->set_tokens(offset);
        seq->set_image_tokens(image_tokens);
      }
    };
    for (uint32_t m = 0; m < split.text_micro_batches; ++m) add_mb(v1::MODALITY_TEXT, m * tmb, tmb);
    for (uint32_t m = 0; m < split.vl_micro_batches; ++m) {
      add_mb(v1::MODALITY_VL, d_.text_seqs + m * vmb, vmb);
    }
    // Encoder phases.
    if (d_.enc_images.size(r) > 0) {
      v1::EncoderPhase* ph = rp->add_encoders();
      ph->set_encoder(v1::ENCODER_VISION);
      double cost = 0;
      for (uint32_t k = 0; k < d_.enc_images.size(r); ++k) {
        const PlannedImage& im = d_.images[d_.enc_images.row(r)[k]];
        v1::ImagePlan* ip = ph->add_images();
        ip->set_sample_id(d_.samples[im.owner].sample);
        ip->set_image_index(im.image_index);
        ip->set_resized_height(im.height);
        ip->set_resized_width(im.width);
        ip->set_grid_t(1);
        ip->set_grid_h(im.grid_h);
        ip->set_grid_w(im.grid_w);
        ip->set_patches(im.patches);
        ip->set_llm_tokens(im.llm_tokens);
        ip->set_cost(im.cost);
        ip->set_llm_rank(d_.samples[im.owner].rank);
        ip->set_output_bytes(im.output_bytes);
        ip->set_remote_load(im.remote_load);
        if (locality && im.remote_load) ip->set_holder_node(im.load_source / rpn);
        cost += im.cost;
      }
      for (uint32_t c = d_.rank_chunks[r]; c < d_.rank_chunks[r + 1]; ++c) {
        v1::EncoderChunk* ch = ph->add_chunks();
        for (uint32_t k = d_.chunks.begin[c]; k < d_.chunks.begin[c + 1]; ++k) {
          ch->add_items(d_.chunks.items[k]);
        }
        ch->set_patches(d_.chunk_patches[c]);
      }
      ph->set_cost(cost);
    }
    if (d_.enc_audio.size(r) > 0) {
      v1::EncoderPhase* ph = rp->add_encoders();
      ph->set_encoder(v1::ENCODER_AUDIO);
      double cost = 0;
      uint64_t frames = 0;
      v1::EncoderChunk* ch = ph->add_chunks();
      for (uint32_t k = 0; k < d_.enc_audio.size(r); ++k) {
        const PlannedAudio& au = d_.audio[d_.enc_audio.row(r)[k]];
        v1::AudioPlan* ap = ph->add_audio();
        ap->set_sample_id(d_.samples[au.owner].sample);
        ap->set_audio_index(au.audio_index);
        ap->set_frames(au.frames);
        ap->set_tokens(au.tokens);
        ap->set_cost(au.cost);
        ap->set_llm_rank(d_.samples[au.owner].rank);
        ap->set_output_bytes(au.output_bytes);
        ap->set_remote_load(au.remote_load);
        if (locality && au.remote_load) ap->set_holder_node(au.load_source / rpn);
        cost += au.cost;
        frames += au.frames;
        ch->add_items(k);
      }
      ch->set_patches(frames);
      ph->set_cost(cost);
    }
    // Exchange.
    v1::Exchange* ex = rp->mutable_exchange();
    uint64_t inter = 0;
    ex->set_send_bytes(
        AddTransfers(d_.sends, r, /*peer_is_llm=*/true, ex->mutable_sends(), r / rpn, rpn, &inter));
    ex->set_inter_node_send_bytes(inter);
    uint64_t unused = 0;
    ex->set_recv_bytes(AddTransfers(d_.recvs, r, /*peer_is_llm=*/false, ex->mutable_recvs(),
                                    r / rpn, rpn, &unused));
    // Load exchange (post-balancing, remote inputs); absent when empty.
    if (!d_.load_sends.begin.empty() && !d_.load_sends.items.empty()) {
      v1::Exchange* lx = rp->mutable_load_exchange();
      uint64_t load_inter = 0;
      lx->set_send_bytes(AddLoadTransfers(d_.load_sends, r, /*sends=*/true, lx->mutable_sends(),
                                          r / rpn, rpn, &load_inter));
      lx->set_inter_node_send_bytes(load_inter);
      lx->set_recv_bytes(AddLoadTransfers(d_.load_recvs, r, /*sends=*/false, lx->mutable_recvs(),
                                          r / rpn, rpn, &unused));
    }
    // Costs and the drawn split.
    const RankTotals& t = d_.ranks[r];
    v1::RankCost* c = rp->mutable_cost();
    c->set_vit(t.vit);
    c->set_llm(t.llm);
    c->set_audio(t.audio);
    c->set_llm_tokens(t.llm_tokens);
    c->set_image_tokens(t.image_tokens);
    c->set_patches(t.patches);
    c->set_images(t.images);
    c->set_samples(t.samples);
    for (uint32_t k = r; k < d_.samples.size(); k += d_.world_size) {
      rp->add_drawn(d_.samples[k].sample);
    }
  }

  uint64_t AddTransfers(const Csr& csr, uint32_t r, bool peer_is_llm,
                        google::protobuf::RepeatedPtrField<v1::Transfer>* out, uint32_t node,
                        uint32_t rpn, uint64_t* inter) {
    const uint32_t I = static_cast<uint32_t>(d_.images.size());
    uint64_t total = 0;
    v1::Transfer* t = nullptr;
    for (uint32_t k = 0; k < csr.size(r); ++k) {
      const uint32_t item = csr.row(r)[k];
      const uint32_t peer = peer_is_llm ? d_.LlmRank(item) : d_.EncRank(item);
      const bool image = item < I;
      if (t == nullptr || t->peer() != peer) {
        t = out->Add();
        t->set_peer(peer);
      }
      const uint32_t owner = image ? d_.images[item].owner : d_.audio[item - I].owner;
      v1::TransferItem* ti = t->add_items();
      ti->set_sample_id(d_.samples[owner].sample);
      ti->set_encoder(image ? v1::ENCODER_VISION : v1::ENCODER_AUDIO);
      ti->set_index(image ? d_.images[item].image_index : d_.audio[item - I].audio_index);
      const uint64_t bytes = d_.OutputBytes(item);
      ti->set_bytes(bytes);
      t->set_bytes(t->bytes() + bytes);
      total += bytes;
      if (peer / rpn != node) *inter += bytes;
    }
    return total;
  }

  // Transfers of the load exchange: items as in StepPlanData (images, audio
  // clips, then documents' token ids, encoder ENCODER_UNSPECIFIED).
  uint64_t AddLoadTransfers(const Csr& csr, uint32_t r, bool sends,
                            google::protobuf::RepeatedPtrField<v1::Transfer>* out, uint32_t node,
                            uint32_t rpn, uint64_t* inter) {
    const uint32_t I = static_cast<uint32_t>(d_.images.size());
    const uint32_t A = static_cast<uint32_t>(d_.audio.size());
    uint64_t total = 0;
    v1::Transfer* t = nullptr;
    for (uint32_t k = 0; k < csr.size(r); ++k) {
      const uint32_t item = csr.row(r)[k];
      const uint32_t peer = sends ? d_.LoadDest(item) : d_.LoadSource(item);
      if (t == nullptr || t->peer() != peer) {
        t = out->Add();
        t->set_peer(peer);
      }
      v1::TransferItem* ti = t->add_items();
      ti->set_sample_id(d_.samples[d_.LoadOwner(item)].sample);
      if (item < I) {
        ti->set_encoder(v1::ENCODER_VISION);
        ti->set_index(d_.images[item].image_index);
      } else if (item < I + A) {
        ti->set_encoder(v1::ENCODER_AUDIO);
        ti->set_index(d_.audio[item - I].audio_index);
      } else {
        ti->set_encoder(v1::ENCODER_UNSPECIFIED);
      }
      const uint64_t bytes = d_.LoadBytes(item);
      ti->set_bytes(bytes);
      t->set_bytes(t->bytes() + bytes);
      total += bytes;
      if (peer / rpn != node) *inter += bytes;
    }
    return total;
  }

  const Job& job_;
  const Index& ix_;
  const StepPlanData& d_;
  v1::StepPlan* plan_;
  std::vector<int32_t>* shard_pos_ = nullptr;
  std::vector<uint32_t> used_shards_;
};

}  // namespace

absl::Status CheckRanks(const Job& job, absl::Span<const uint32_t> ranks) {
  for (uint32_t r : ranks) {
    if (r >= job.world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " is outside the world: the job has world_size ",
                       job.world_size(), " (ranks 0..", job.world_size() - 1,
                       "); ask for a rank in that range or restart the "
                       "packer with the job's real world_size"));
    }
  }
  return absl::OkStatus();
}

absl::Status BuildStepPlan(const Job& job, const StepPlanData& data,
                           absl::Span<const uint32_t> ranks, v1::StepPlan* plan) {
  if (absl::Status s = CheckRanks(job, ranks); !s.ok()) return s;
  thread_local std::vector<uint32_t> list;
  list.assign(ranks.begin(), ranks.end());
  if (list.empty()) {
    for (uint32_t r = 0; r < data.world_size; ++r) list.push_back(r);
  } else {
    std::sort(list.begin(), list.end());
    list.erase(std::unique(list.begin(), list.end()), list.end());
  }
  PlanBuilder(job, data, plan).Build(list);
  return absl::OkStatus();
}

void BuildJobInfo(const Job& job, v1::JobInfo* info) {
  const Index& ix = job.index();
  *info->mutable_config() = job.config();
  info->set_config_fingerprint(job.fingerprint());
  info->set_samples(ix.num_samples());
  info->set_text_samples(job.text_samples().size());  // what the streams draw from
  info->set_vl_samples(job.vl_samples().size());
  if (const Mixture* m = job.mixture()) {  // what the sources hold
    uint64_t n[2] = {0, 0};
    for (uint32_t i = 0; i < m->num_sources(); ++i) {
      n[0] += m->source(i).part[0].n;
      n[1] += m->source(i).part[1].n;
    }
    info->set_text_samples(n[0]);
    info->set_vl_samples(n[1]);
  }
  info->set_steps_per_epoch(job.steps_per_epoch());
  info->set_total_steps(job.total_steps());
  for (const IndexShard& s : ix.shards()) info->add_shards(s.name);
  info->set_dataset_bytes(ix.dataset_bytes());
  const Mixture* m = job.mixture();
  for (uint32_t i = 0; i < job.num_sources(); ++i) {
    v1::SourceInfo* si = info->add_sources();
    si->set_name(job.source_name(i));
    if (m != nullptr) {
      si->set_text_samples(m->source(i).part[0].n);
      si->set_vl_samples(m->source(i).part[1].n);
      si->set_text_epoch_samples(m->source(i).part[0].epoch_size);
      si->set_vl_epoch_samples(m->source(i).part[1].epoch_size);
    } else {
      const uint64_t n = i == 0 ? job.text_samples().size() : job.vl_samples().size();
      if (i == 0) {
        si->set_text_samples(n);
        si->set_text_epoch_samples(n);
      } else {
        si->set_vl_samples(n);
        si->set_vl_epoch_samples(n);
      }
    }
  }
  if (m != nullptr) {
    for (const auto& [start, digest] : m->history()) {
      v1::MixtureHistory* h = info->add_mixture_history();
      h->set_start_step(start);
      h->set_fingerprint(digest);
    }
  }
}

std::string PlanIdentityBytes(v1::StepPlan* plan) {
  const double seconds = plan->stats().plan_seconds();
  plan->mutable_stats()->set_plan_seconds(0);
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    plan->SerializeToCodedStream(&coded);
  }
  plan->mutable_stats()->set_plan_seconds(seconds);
  return bytes;
}

std::string PlanHash(v1::StepPlan* plan) {
  const std::string bytes = PlanIdentityBytes(plan);
  const uint32_t a = Crc32c(bytes);
  const uint32_t b = Crc32cExtend(0x9E3779B9u, bytes.data(), bytes.size());
  return absl::StrCat(absl::Hex(a, absl::kZeroPad8), absl::Hex(b, absl::kZeroPad8));
}

namespace {

using ItemKey = std::tuple<int, uint64_t, uint32_t>;  // (encoder, sample, index)

// Per rank, every encoder item's row in its encoder output and in its LLM
// input (images and audio clips counted apart).
struct Rows {
  std::map<ItemKey, uint32_t> enc, llm;
};

std::vector<Rows> RowsOf(const v1::StepPlan& plan) {
  std::map<uint64_t, const v1::SampleInfo*> samples;
  for (const auto& si : plan.samples()) samples[si.sample_id()] = &si;
  std::vector<Rows> rows(plan.world_size());
  for (const auto& rp : plan.ranks()) {
    if (rp.rank() >= rows.size()) continue;
    Rows& r = rows[rp.rank()];
    for (const auto& ph : rp.encoders()) {
      uint32_t row = 0;
      for (const auto& ip : ph.images()) {
        r.enc[{v1::ENCODER_VISION, ip.sample_id(), ip.image_index()}] = row++;
      }
      for (const auto& ap : ph.audio()) {
        r.enc[{v1::ENCODER_AUDIO, ap.sample_id(), ap.audio_index()}] = row++;
      }
    }
    uint32_t image_row = 0, audio_row = 0;
    for (const auto& mb : rp.micro_batches()) {
      for (const auto& seq : mb.sequences()) {
        for (const auto& doc : seq.docs()) {
          for (const auto& di : doc.images()) {
            r.llm[{v1::ENCODER_VISION, doc.sample_id(), di.image_index()}] = image_row++;
          }
          auto it = samples.find(doc.sample_id());
          const bool part = doc.pieces() > 0 || doc.truncated();
          const uint32_t first = part ? doc.first_audio() : 0;
          const uint32_t n = part                  ? doc.audio_count()
                             : it != samples.end() ? it->second->audio_size()
                                                   : 0;
          for (uint32_t a = first; a < first + n; ++a) {
            r.llm[{v1::ENCODER_AUDIO, doc.sample_id(), a}] = audio_row++;
          }
        }
      }
    }
  }
  return rows;
}

}  // namespace

absl::Status CheckExchangeLayout(const v1::StepPlan& plan, ExchangeLayoutCounts* counts) {
  const uint32_t W = plan.world_size();
  if (static_cast<uint32_t>(plan.ranks_size()) != W) {
    return absl::InvalidArgumentError(absl::StrCat("step ", plan.step(), ": the plan holds ",
                                                   plan.ranks_size(), " of ", W, " ranks"));
  }
  const std::vector<Rows> rows = RowsOf(plan);
  auto key = [](const v1::TransferItem& it) {
    return ItemKey{it.encoder(), it.sample_id(), it.index()};
  };
  auto fail = [&](uint32_t e, uint32_t r, auto... what) {
    return absl::InternalError(
        absl::StrCat("step ", plan.step(), ", rank ", e, " to rank ", r, ": ", what...));
  };
  // Per rank and encoder, items in its encoder output and in its documents.
  std::vector<std::map<int, uint32_t>> encoded(W), held(W), received(W);
  for (uint32_t r = 0; r < W; ++r) {
    for (const auto& [k, row] : rows[r].enc) ++encoded[r][std::get<0>(k)];
    for (const auto& [k, row] : rows[r].llm) ++held[r][std::get<0>(k)];
  }
  for (const auto& rp : plan.ranks()) {
    const uint32_t e = rp.rank();
    if (e >= W) return fail(e, e, "no such rank");
    std::map<int, uint32_t> next;  // per encoder, the next row of e's output to send
    for (const auto& t : rp.exchange().sends()) {
      const uint32_t r = t.peer();
      if (r >= W) return fail(e, r, "no such rank");
      const v1::Transfer* back = nullptr;
      for (const auto& u : plan.ranks(r).exchange().recvs()) {
        if (u.peer() == e) back = &u;
      }
      if (back == nullptr) return fail(e, r, "the receiver lists no transfer from the sender");
      if (back->items_size() != t.items_size()) {
        return fail(e, r, "the two ends list ", t.items_size(), " / ", back->items_size(),
                    " items");
      }
      int prev_encoder = 0;
      for (int k = 0; k < t.items_size(); ++k) {
        const ItemKey item = key(t.items(k));
        if (key(back->items(k)) != item) return fail(e, r, "item ", k, " differs");
        const int enc = std::get<0>(item);
        if (enc < prev_encoder) {
          return fail(e, r, "item ", k, " (encoder ", enc, ") comes after an item of encoder ",
                      prev_encoder, ": a pair lists its images, then its audio clips");
        }
        prev_encoder = enc;
        // The pair is one run of the sender's output: the next rows of its encoder.
        auto at = rows[e].enc.find(item);
        if (at == rows[e].enc.end() || at->second != next[enc]) {
          return fail(e, r, "item ", k, " is ",
                      at == rows[e].enc.end() ? std::string("not in the sender's encoder output")
                                              : absl::StrCat("row ", at->second,
                                                             " of the "
                                                             "sender's encoder output, not row ",
                                                             next[enc]),
                      ": the encoder rows do not follow the sends");
        }
        ++next[enc];
        if (rows[r].llm.find(item) == rows[r].llm.end()) {
          return fail(e, r, "item ", k, " is not in the receiver's documents");
        }
        ++received[r][enc];
      }
      if (counts != nullptr && r != e && t.items_size() > 0) {
        counts->items += t.items_size();
        ++counts->pairs;
        std::set<int> encoders;
        for (const auto& it : t.items()) encoders.insert(it.encoder());
        counts->runs += encoders.size();
      }
    }
    if (next != encoded[e]) {
      return fail(e, e, "the sends hold other items than the rank's encoder output");
    }
  }
  for (uint32_t r = 0; r < W; ++r) {
    if (received[r] != held[r]) {
      return fail(r, r, "the receives hold other items than the rank's documents");
    }
  }
  return absl::OkStatus();
}

}  // namespace tutti::packer
