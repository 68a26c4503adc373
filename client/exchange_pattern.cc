#include "client/exchange_pattern.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/rng.h"

namespace tutti {
namespace {

uint64_t ItemSeed(uint64_t salt, const v1::TransferItem& item) {
  return Mix64(
      Mix64(Mix64(salt ^ item.sample_id()) ^ static_cast<uint64_t>(item.encoder())) ^
      item.index());
}

// The 8 pattern bytes of word w (offsets 8w .. 8w+7) of an item.
uint64_t Word(uint64_t seed, uint64_t w) {
  return Mix64(seed + kGoldenGamma * (w + 1));
}

absl::Status CheckSize(const Transfers& transfers, size_t size) {
  uint64_t total = 0;
  for (const v1::Transfer& t : transfers) {
    uint64_t items = 0;
    for (const v1::TransferItem& item : t.items()) items += item.bytes();
    if (items != t.bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the transfer with peer ", t.peer(), " has ", t.bytes(),
                       " bytes but its items add up to ", items,
                       "; patterns need every byte to belong to an item"));
    }
    total += t.bytes();
  }
  if (total != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the buffer is ", size, " bytes but the transfers hold ", total));
  }
  return absl::OkStatus();
}

}  // namespace

void FillSeedStream(uint64_t seed, uint8_t* out, uint64_t n) {
  uint64_t o = 0;
  for (; o + 8 <= n; o += 8) {
    const uint64_t w = Word(seed, o / 8);
    std::memcpy(out + o, &w, 8);
  }
  if (o < n) {
    const uint64_t w = Word(seed, o / 8);
    std::memcpy(out + o, &w, n - o);
  }
}

uint8_t PatternByte(uint64_t salt, const v1::TransferItem& item, uint64_t offset) {
  return static_cast<uint8_t>(Word(ItemSeed(salt, item), offset / 8) >> (8 * (offset % 8)));
}

absl::Status FillPattern(const Transfers& transfers, uint64_t salt, uint8_t* buf, size_t size) {
  if (absl::Status s = CheckSize(transfers, size); !s.ok()) return s;
  uint8_t* p = buf;
  for (const v1::Transfer& t : transfers) {
    for (const v1::TransferItem& item : t.items()) {
      FillSeedStream(ItemSeed(salt, item), p, item.bytes());
      p += item.bytes();
    }
  }
  return absl::OkStatus();
}

absl::Status VerifyPattern(const Transfers& transfers, uint64_t salt, const uint8_t* buf,
                           size_t size) {
  if (absl::Status s = CheckSize(transfers, size); !s.ok()) return s;
  const uint8_t* p = buf;
  for (const v1::Transfer& t : transfers) {
    for (const v1::TransferItem& item : t.items()) {
      const uint64_t seed = ItemSeed(salt, item);
      for (uint64_t o = 0; o < item.bytes(); o += 8) {
        const uint64_t w = Word(seed, o / 8);
        const uint64_t n = std::min<uint64_t>(8, item.bytes() - o);
        if (std::memcmp(p + o, &w, n) == 0) continue;
        for (uint64_t k = 0; k < n; ++k) {
          const uint8_t want = static_cast<uint8_t>(w >> (8 * k));
          if (p[o + k] != want) {
            return absl::DataLossError(absl::StrCat(
                "wrong byte at offset ", o + k, " of item (sample ", item.sample_id(), ", encoder ",
                item.encoder(), ", index ", item.index(), ") exchanged with peer ", t.peer(),
                " (buffer offset ", (p - buf) + o + k, "): expected ", static_cast<int>(want),
                ", found ", static_cast<int>(p[o + k])));
          }
        }
      }
      p += item.bytes();
    }
  }
  return absl::OkStatus();
}

}  // namespace tutti
