#include "client/exchange_pattern.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "client/testing/random_exchange.h"

namespace tutti {
namespace {

using ::testing::HasSubstr;

TEST(ExchangePattern, SenderAndReceiverAgree) {
  RandomExchangeOptions o;
  o.world_size = 3;
  o.seed = 5;
  o.max_item_bytes = 301;
  auto plans = RandomExchangePlans(o);
  // What rank 0 sends rank 1 is, byte for byte, what rank 1 expects from rank 0.
  const auto& ex0 = plans[0].exchange();
  std::vector<uint8_t> send(ex0.send_bytes());
  ASSERT_TRUE(FillPattern(ex0.sends(), kForwardSalt, send.data(), send.size()).ok());
  uint64_t off = 0;
  for (const auto& t : ex0.sends()) {
    for (const auto& item : t.items()) {
      for (uint64_t i = 0; i < item.bytes(); ++i) {
        ASSERT_EQ(send[off + i], PatternByte(kForwardSalt, item, i));
      }
      off += item.bytes();
    }
  }
  std::vector<uint8_t> self(send);
  EXPECT_TRUE(VerifyPattern(ex0.sends(), kForwardSalt, self.data(), self.size()).ok());
  EXPECT_FALSE(VerifyPattern(ex0.sends(), kBackwardSalt, self.data(), self.size()).ok());
}

TEST(ExchangePattern, AWrongByteIsLocated) {
  google::protobuf::RepeatedPtrField<v1::Transfer> transfers;
  auto* t = transfers.Add();
  t->set_peer(2);
  t->set_bytes(30);
  auto* a = t->add_items();
  a->set_sample_id(7);
  a->set_bytes(10);
  auto* b = t->add_items();
  b->set_sample_id(8);
  b->set_index(1);
  b->set_bytes(20);
  std::vector<uint8_t> buf(30);
  ASSERT_TRUE(FillPattern(transfers, 1, buf.data(), buf.size()).ok());
  buf[23] ^= 0x40;
  absl::Status s = VerifyPattern(transfers, 1, buf.data(), buf.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("offset 13 of item (sample 8, encoder 0, index 1)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("peer 2 (buffer offset 23)"));
}

TEST(ExchangePattern, RefusesMismatchedBuffers) {
  google::protobuf::RepeatedPtrField<v1::Transfer> transfers;
  auto* t = transfers.Add();
  t->set_bytes(4);
  std::vector<uint8_t> buf(4);
  EXPECT_THAT(std::string(FillPattern(transfers, 1, buf.data(), 4).message()),
              HasSubstr("items add up to 0"));
  t->add_items()->set_bytes(4);
  EXPECT_THAT(std::string(FillPattern(transfers, 1, buf.data(), 3).message()),
              HasSubstr("the buffer is 3 bytes but the transfers hold 4"));
}

}  // namespace
}  // namespace tutti
