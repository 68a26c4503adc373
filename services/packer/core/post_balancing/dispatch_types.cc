#include "services/packer/core/post_balancing/dispatch_types.h"

namespace tutti::dispatch {

const char* EncoderPhaseName(EncoderKind kind) {
  return kind == EncoderKind::kVision ? "vit" : "audio";
}

ShardAvailability ShardAvailability::None(uint32_t shards, uint32_t nodes) {
  ShardAvailability a;
  a.all_ = false;
  a.shards_ = shards;
  a.nodes_ = nodes;
  a.bits_.assign((uint64_t{shards} * nodes + 63) / 64, 0);
  return a;
}

void ShardAvailability::Set(uint32_t shard, uint32_t node, bool staged) {
  if (all_ || shard >= shards_ || node >= nodes_) return;
  const uint64_t bit = uint64_t{shard} * nodes_ + node;
  if (staged) {
    bits_[bit / 64] |= uint64_t{1} << (bit % 64);
  } else {
    bits_[bit / 64] &= ~(uint64_t{1} << (bit % 64));
  }
}

bool ShardAvailability::Has(uint32_t shard, uint32_t node) const {
  if (all_) return true;
  if (shard >= shards_ || node >= nodes_) return false;
  const uint64_t bit = uint64_t{shard} * nodes_ + node;
  return (bits_[bit / 64] >> (bit % 64)) & 1;
}

namespace {

// Calls f(word, base) for each 64-bit word of `bits` holding bits
// [first, last), masked to them (bit i of the word is bit base + i), until f
// returns true; returns whether it did.
template <typename F>
bool ScanWords(const std::vector<uint64_t>& bits, uint64_t first, uint64_t last, F f) {
  for (uint64_t w = first / 64; w * 64 < last; ++w) {
    uint64_t word = bits[w];
    const uint64_t base = w * 64;
    if (base < first) word &= ~uint64_t{0} << (first - base);
    if (last - base < 64) word &= (uint64_t{1} << (last - base)) - 1;
    if (f(word, base)) return true;
  }
  return false;
}

}  // namespace

void ShardAvailability::AppendNodes(uint32_t shard, std::vector<uint32_t>* out) const {
  if (all_ || shard >= shards_) return;
  const uint64_t first = uint64_t{shard} * nodes_;
  ScanWords(bits_, first, first + nodes_, [&](uint64_t word, uint64_t base) {
    for (; word != 0; word &= word - 1) {
      out->push_back(static_cast<uint32_t>(base + __builtin_ctzll(word) - first));
    }
    return false;
  });
}

bool ShardAvailability::AnyNode(uint32_t shard) const {
  if (all_) return true;
  if (shard >= shards_) return false;
  const uint64_t first = uint64_t{shard} * nodes_;
  return ScanWords(bits_, first, first + nodes_, [](uint64_t word, uint64_t) { return word != 0; });
}

StagingIndex::StagingIndex(const ShardAvailability& a) : all_(a.all()) {
  if (all_) return;
  everywhere_.assign(a.shards(), 0);
  offset_.reserve(uint64_t{a.shards()} + 1);
  for (uint32_t s = 0; s < a.shards(); ++s) {
    a.AppendNodes(s, &nodes_);
    offset_.push_back(static_cast<uint32_t>(nodes_.size()));
    everywhere_[s] = offset_[s + 1] - offset_[s] == a.nodes();
  }
}

}  // namespace tutti::dispatch
