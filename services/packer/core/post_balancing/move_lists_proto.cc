#include "services/packer/core/post_balancing/move_lists_proto.h"

namespace tutti::dispatch {
namespace {

void FillTransfers(const DispatchInput& in, const std::vector<Transfer>& list,
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
}

}  // namespace

v1::Encoder ToProtoEncoder(EncoderKind kind) {
  return kind == EncoderKind::kVision ? v1::ENCODER_VISION : v1::ENCODER_AUDIO;
}

void FillExchange(const DispatchInput& in, const RankExchange& x, v1::Exchange* out) {
  out->Clear();
  FillTransfers(in, x.sends, out->mutable_sends());
  FillTransfers(in, x.recvs, out->mutable_recvs());
  out->set_send_bytes(x.send_bytes);
  out->set_recv_bytes(x.recv_bytes);
  out->set_inter_node_send_bytes(x.inter_node_send_bytes);
}

}  // namespace tutti::dispatch
