#include "services/packer/core/post_balancing/move_lists_proto.h"

#include <gtest/gtest.h>

#include <map>

#include "services/packer/core/post_balancing/post_balancing.h"
#include "services/packer/testing/post_samples.h"

namespace tutti::dispatch {
namespace {

using testing::AddAudio;
using testing::SmallOptions;
using testing::Text;
using testing::Vl;

// Sends of every rank, re-labelled with the receiver, equal the receivers'
// receives: what the client's transport checks across ranks before moving
// data.
TEST(PlanProtoTest, ExchangesMatchAcrossRanksAndNameTheirItems) {
  DispatchInput in;
  in.samples = {Vl(10, {400, 80}, 50, 0, 0), Vl(11, {1600}, 30, 1, 1), Text(12, 900, 2, 1),
                Vl(13, {120, 120, 120}, 10, 3, 0)};
  AddAudio(&in.samples[1], 60);
  in.availability = ShardAvailability::None(2, 2);
  in.availability.Set(0, 0, true);
  in.availability.Set(1, 1, true);
  const DispatchOptions o = SmallOptions(4, 2, 4096);
  auto plan = Dispatch(in, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (bool load : {false, true}) {
    std::map<std::pair<uint32_t, uint32_t>, std::string> sent, received;
    uint64_t bytes = 0;
    for (uint32_t r = 0; r < 4; ++r) {
      v1::Exchange x;
      FillExchange(in, (load ? plan->load : plan->forward)[r], &x);
      uint64_t total = 0;
      for (const auto& t : x.sends()) {
        uint64_t items = 0;
        for (const auto& it : t.items()) {
          items += it.bytes();
          EXPECT_GE(it.sample_id(), 10u);
          EXPECT_LE(it.sample_id(), 13u);
          if (!load) EXPECT_NE(it.encoder(), v1::ENCODER_UNSPECIFIED);
        }
        EXPECT_EQ(items, t.bytes());
        total += t.bytes();
        sent[{r, t.peer()}] = t.SerializeAsString();
      }
      EXPECT_EQ(total, x.send_bytes());
      bytes += total;
      for (const auto& t : x.recvs()) {
        v1::Transfer as_sent = t;
        as_sent.set_peer(r);
        received[{t.peer(), r}] = as_sent.SerializeAsString();
      }
    }
    EXPECT_EQ(sent, received) << (load ? "load" : "forward");
    if (load) {
      EXPECT_EQ(bytes, plan->stats.remote_load_bytes);
    } else {
      EXPECT_EQ(bytes, plan->stats.inter_node_bytes + plan->stats.intra_node_bytes +
                           plan->stats.self_bytes);
    }
  }
}

}  // namespace
}  // namespace tutti::dispatch
