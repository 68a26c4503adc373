#include "client/testing/random_exchange.h"

#include <random>

#include "client/exchange_layout.h"

namespace tutti {

std::vector<v1::RankPlan> RandomExchangePlans(const RandomExchangeOptions& opts) {
  const uint32_t w = opts.world_size;
  std::mt19937_64 rng(opts.seed);
  auto uniform = [&](uint64_t n) { return n == 0 ? 0 : rng() % (n + 1); };  // [0, n]
  // items[src][dst]: vision items, then audio items.
  std::vector<std::vector<std::vector<v1::TransferItem>>> items(
      w, std::vector<std::vector<v1::TransferItem>>(w));
  uint64_t next_sample = opts.seed * 1000003;
  for (uint32_t src = 0; src < w; ++src) {
    for (uint32_t dst = 0; dst < w; ++dst) {
      if (static_cast<double>(rng() % 1000) < opts.empty_pair_fraction * 1000) continue;
      const uint64_t n = 1 + uniform(opts.max_items_per_pair > 0 ? opts.max_items_per_pair - 1 : 0);
      for (uint64_t k = 0; k < n; ++k) {
        v1::TransferItem item;
        item.set_sample_id(next_sample++);
        item.set_encoder(k < (n + 1) / 2 ? v1::ENCODER_VISION : v1::ENCODER_AUDIO);
        item.set_index(static_cast<uint32_t>(k));
        item.set_bytes(uniform(opts.max_item_bytes));
        items[src][dst].push_back(item);
      }
    }
  }
  std::vector<v1::RankPlan> plans(w);
  for (uint32_t r = 0; r < w; ++r) {
    plans[r].set_rank(r);
    plans[r].set_plan_version(kMinExchangePlanVersion);
    v1::EncoderPhase* vision = plans[r].add_encoders();
    vision->set_encoder(v1::ENCODER_VISION);
    v1::EncoderPhase* audio = plans[r].add_encoders();
    audio->set_encoder(v1::ENCODER_AUDIO);
    v1::Exchange* ex = plans[r].mutable_exchange();
    auto add = [](google::protobuf::RepeatedPtrField<v1::Transfer>* list, uint32_t peer,
                  const std::vector<v1::TransferItem>& its) -> uint64_t {
      if (its.empty()) return 0;
      v1::Transfer* t = list->Add();
      t->set_peer(peer);
      uint64_t bytes = 0;
      for (const auto& it : its) {
        *t->add_items() = it;
        bytes += it.bytes();
      }
      t->set_bytes(bytes);
      return bytes;
    };
    uint64_t sent = 0, received = 0;
    for (uint32_t p = 0; p < w; ++p) {
      sent += add(ex->mutable_sends(), p, items[r][p]);
      received += add(ex->mutable_recvs(), p, items[p][r]);
      for (const v1::TransferItem& it : items[r][p]) {
        if (it.encoder() == v1::ENCODER_VISION) {
          v1::ImagePlan* ip = vision->add_images();
          ip->set_sample_id(it.sample_id());
          ip->set_image_index(it.index());
          ip->set_llm_rank(p);
          ip->set_output_bytes(it.bytes());
        } else {
          v1::AudioPlan* ap = audio->add_audio();
          ap->set_sample_id(it.sample_id());
          ap->set_audio_index(it.index());
          ap->set_llm_rank(p);
          ap->set_output_bytes(it.bytes());
        }
      }
    }
    ex->set_send_bytes(sent);
    ex->set_recv_bytes(received);
  }
  return plans;
}

}  // namespace tutti
