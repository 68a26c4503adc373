#include "services/packer/dispatch/plan_proto.h"

#include "absl/strings/str_cat.h"
#include "common/cost_model.h"

namespace tutti::dispatch {
namespace {

void FillExchange(const DispatchInput& in, const RankExchange& x, v1::Exchange* out) {
  auto fill = [&](const std::vector<Transfer>& list,
                  google::protobuf::RepeatedPtrField<v1::Transfer>* dst) {
    dst->Reserve(static_cast<int>(list.size()));
    for (const Transfer& t : list) {
      v1::Transfer* pt = dst->Add();
      pt->set_peer(t.peer);
      pt->set_bytes(t.bytes);
      pt->mutable_items()->Reserve(static_cast<int>(t.items.size()));
      for (const ExchangeItem& it : t.items) {
        v1::TransferItem* pi = pt->add_items();
        pi->set_sample_id(in.samples[it.sample].sample_id);
        pi->set_encoder(it.payload == Payload::kTextTokens ? v1::ENCODER_UNSPECIFIED
                                                           : ToProtoEncoder(it.encoder));
        pi->set_index(it.index);
        pi->set_bytes(it.bytes);
      }
    }
  };
  fill(x.sends, out->mutable_sends());
  fill(x.recvs, out->mutable_recvs());
  out->set_send_bytes(x.send_bytes);
  out->set_recv_bytes(x.recv_bytes);
  out->set_inter_node_send_bytes(x.inter_node_send_bytes);
}

}  // namespace

v1::Encoder ToProtoEncoder(EncoderKind kind) {
  return kind == EncoderKind::kVision ? v1::ENCODER_VISION : v1::ENCODER_AUDIO;
}

absl::Status FillRankPlan(const DispatchInput& in, const DispatchOptions& o,
                          const DispatchPlan& plan, uint32_t rank, const PlanProtoOptions& proto,
                          v1::RankPlan* out) {
  const uint32_t W = plan.cluster.world_size;
  if (rank >= W || plan.llm.size() != W || plan.forward.size() != W || plan.load.size() != W) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not in a plan of ", W, " ranks"));
  }
  const CostModel model(o.cost);
  out->Clear();
  out->set_rank(rank);
  out->set_node(plan.cluster.node_of(rank));
  v1::RankCost* cost = out->mutable_cost();

  // LLM phase.
  for (const MicroBatchPlan& mb : plan.llm[rank].micro_batches) {
    v1::MicroBatch* pm = out->add_micro_batches();
    pm->set_modality(mb.vl ? v1::MODALITY_VL : v1::MODALITY_TEXT);
    for (const SequencePlan& sp : mb.sequences) {
      v1::Sequence* ps = pm->add_sequences();
      uint32_t offset = 0, image_tokens = 0;
      for (uint32_t s : sp.docs) {
        const Sample& x = in.samples[s];
        uint32_t enc_tokens = 0;
        for (int e = 0; e < kNumEncoders; ++e) {
          for (const EncoderItem& it : x.items[e]) enc_tokens += it.output_tokens;
        }
        for (const EncoderItem& it : x.items[int(EncoderKind::kVision)]) {
          image_tokens += it.output_tokens;
        }
        v1::DocSlot* d = ps->add_docs();
        d->set_sample_id(x.sample_id);
        d->set_offset(offset);
        d->set_length(x.llm_tokens);
        d->set_encoder_tokens(enc_tokens);
        d->set_remote_load(plan.text_remote[s] != 0);
        offset += x.llm_tokens;
        cost->set_samples(cost->samples() + 1);
      }
      ps->set_tokens(offset);
      ps->set_image_tokens(image_tokens);
      cost->set_llm_tokens(cost->llm_tokens() + offset);
      cost->set_image_tokens(cost->image_tokens() + image_tokens);
    }
  }
  cost->set_llm(plan.llm[rank].cost);

  // Encoder phases: every encoder with items in the step, even if this rank
  // has none, so all ranks list the same phases.
  for (int e = 0; e < kNumEncoders; ++e) {
    const EncoderPhasePlan& ep = plan.encoders[e];
    if (plan.item_offset[e].empty() || plan.item_offset[e].back() == 0) continue;
    v1::EncoderPhase* pe = out->add_encoders();
    pe->set_encoder(ToProtoEncoder(ep.kind));
    double phase_cost = 0;
    uint64_t chunk_patches = 0;
    v1::EncoderChunk* chunk = nullptr;
    for (const ItemRef& ref : ep.rank_items[rank]) {
      const Sample& x = in.samples[ref.sample];
      const EncoderItem& it = x.items[e][ref.item];
      const uint32_t flat = plan.item_offset[e][ref.sample] + ref.item;
      const uint32_t llm_rank = plan.llm_rank[ref.sample];
      const uint64_t out_bytes = EmbeddingBytes(it.output_tokens, o);
      if (ep.kind == EncoderKind::kVision) {
        const double c = model.Vit(it.units);
        v1::ImagePlan* pi = pe->add_images();
        pi->set_sample_id(x.sample_id);
        pi->set_image_index(it.index);
        pi->set_resized_height(it.height);
        pi->set_resized_width(it.width);
        pi->set_grid_t(it.grid_t);
        pi->set_grid_h(it.grid_h);
        pi->set_grid_w(it.grid_w);
        pi->set_patches(it.units);
        pi->set_llm_tokens(it.output_tokens);
        pi->set_cost(c);
        pi->set_llm_rank(llm_rank);
        pi->set_output_bytes(out_bytes);
        pi->set_remote_load(ep.remote_load[flat] != 0);
        phase_cost += c;
        cost->set_vit(cost->vit() + c);
        cost->set_patches(cost->patches() + it.units);
        cost->set_images(cost->images() + 1);
        // Chunks of consecutive images up to max_patches_per_chunk.
        if (chunk == nullptr ||
            (chunk_patches > 0 && chunk_patches + it.units > proto.max_patches_per_chunk)) {
          chunk = pe->add_chunks();
          chunk_patches = 0;
        }
        chunk->add_items(pe->images_size() - 1);
        chunk_patches += it.units;
        chunk->set_patches(chunk_patches);
      } else {
        const double c = model.Audio(it.units);
        v1::AudioPlan* pa = pe->add_audio();
        pa->set_sample_id(x.sample_id);
        pa->set_audio_index(it.index);
        pa->set_frames(it.frames);
        pa->set_tokens(it.output_tokens);
        pa->set_cost(c);
        pa->set_llm_rank(llm_rank);
        pa->set_output_bytes(out_bytes);
        pa->set_remote_load(ep.remote_load[flat] != 0);
        phase_cost += c;
        cost->set_audio(cost->audio() + c);
      }
    }
    pe->set_cost(phase_cost);
  }

  FillExchange(in, plan.forward[rank], out->mutable_exchange());
  FillExchange(in, plan.load[rank], out->mutable_load_exchange());
  for (const Sample& x : in.samples) {
    if (x.drawn_rank == rank) out->add_drawn(x.sample_id);
  }
  return absl::OkStatus();
}

void FillPlanStats(const DispatchPlan& plan, v1::PlanStats* out) {
  out->clear_phases();
  for (const PhaseStats& s : plan.stats.phases) {
    v1::PhaseStats* p = out->add_phases();
    p->set_phase(s.phase);
    p->set_max(s.max);
    p->set_mean(s.mean);
    p->set_imbalance(s.imbalance);
    p->set_lower_bound(s.lower_bound);
    p->set_imbalance_before(s.imbalance_before);
  }
  out->set_inter_node_bytes(plan.stats.inter_node_bytes);
  out->set_intra_node_bytes(plan.stats.intra_node_bytes);
  out->set_remote_load_bytes(plan.stats.remote_load_bytes);
}

}  // namespace tutti::dispatch
