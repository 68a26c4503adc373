// Deterministic buffer contents for checking an exchange end to end: the
// byte at offset o of an item (sample_id, encoder, index) is a hash of those
// and of a salt, so the receiver can verify every byte it got, and where it
// landed, without being told what was sent. Used by tests and by
// `tutti-rank-demo`.
#ifndef TUTTI_CLIENT_EXCHANGE_PATTERN_H_
#define TUTTI_CLIENT_EXCHANGE_PATTERN_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "google/protobuf/repeated_field.h"
#include "tutti/v1/plan.pb.h"

namespace tutti {

using Transfers = google::protobuf::RepeatedPtrField<v1::Transfer>;

// Salts that keep the forward and backward contents apart.
inline constexpr uint64_t kForwardSalt = 0x666f7277617264ull;
inline constexpr uint64_t kBackwardSalt = 0x6261636b776172ull;

// Fills `n` bytes with the stream of `seed`: what FillPattern writes for an
// item whose seed it is. For checks that derive their own seeds.
void FillSeedStream(uint64_t seed, uint8_t* out, uint64_t n);

// The pattern byte of an item at `offset`.
uint8_t PatternByte(uint64_t salt, const v1::TransferItem& item, uint64_t offset);

// Fills `buf` (`size` bytes, laid out as the concatenation of the transfers'
// items) with the items' patterns. INVALID_ARGUMENT when the sizes differ or
// a transfer with bytes lists no items.
absl::Status FillPattern(const Transfers& transfers, uint64_t salt, uint8_t* buf, size_t size);

// Checks `buf` against the pattern; DATA_LOSS naming the first wrong byte's
// peer, item, offset, and expected and found values.
absl::Status VerifyPattern(const Transfers& transfers, uint64_t salt, const uint8_t* buf,
                           size_t size);

}  // namespace tutti

#endif  // TUTTI_CLIENT_EXCHANGE_PATTERN_H_
