// A tournament tree over a vector of non-negative keys: the index of the
// smallest key (ties: lowest index) in O(1), re-reading one changed key in
// O(log n). Masked entries count as +infinity. Not thread-safe.
//
// Every node holds one 64-bit word: the key's IEEE-754 bits (monotonic for
// non-negative doubles) with the lowest bits replaced by the entry's index.
// A level of an update is then one unsigned minimum, without branches; keys
// that differ only in those low bits (a relative 2^-40 for 4,096 entries)
// count as equal and the lower index wins.
#ifndef TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_MIN_TREE_H_
#define TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_MIN_TREE_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace tutti::dispatch {

class MinTree {
 public:
  static constexpr uint32_t kNone = ~0u;

  // `keys` (each >= 0) must outlive the tree; call Update(i) after keys[i]
  // changes.
  explicit MinTree(const std::vector<double>* keys)
      : keys_(keys), masked_(keys->size(), 0), n_(static_cast<uint32_t>(keys->size())) {
    leaves_ = 1;
    while (leaves_ < n_) leaves_ *= 2;
    index_bits_ = 0;
    while ((uint64_t{1} << index_bits_) < leaves_) ++index_bits_;
    index_mask_ = (uint64_t{1} << index_bits_) - 1;
    tree_.assign(2 * leaves_, 0);
    // Padding leaves past n: the masked value with an index above every real one.
    for (uint32_t i = 0; i < leaves_; ++i) {
      tree_[leaves_ + i] = i < n_ ? Value(i) : (kMasked & ~index_mask_) | i;
    }
    for (uint32_t v = leaves_ - 1; v >= 1; --v) tree_[v] = std::min(tree_[2 * v], tree_[2 * v + 1]);
  }

  void Update(uint32_t i) {
    uint32_t v = leaves_ + i;
    tree_[v] = Value(i);
    for (v /= 2; v >= 1; v /= 2) tree_[v] = std::min(tree_[2 * v], tree_[2 * v + 1]);
  }
  void Mask(uint32_t i, bool masked) {
    masked_[i] = masked;
    Update(i);
  }
  // kNone when every entry is masked (or there are none).
  uint32_t Min() const {
    if (n_ == 0 || (tree_[1] & ~index_mask_) == (kMasked & ~index_mask_)) return kNone;
    return static_cast<uint32_t>(tree_[1] & index_mask_);
  }

 private:
  // Above the bits of every non-negative double, +infinity included.
  static constexpr uint64_t kMasked = ~uint64_t{0} >> 1;

  uint64_t Value(uint32_t i) const {
    if (masked_[i]) return (kMasked & ~index_mask_) | i;
    const double key = std::max(0.0, (*keys_)[i]);
    uint64_t bits;
    std::memcpy(&bits, &key, sizeof(bits));
    return (bits & ~index_mask_) | i;
  }

  const std::vector<double>* keys_;
  std::vector<uint8_t> masked_;
  uint32_t n_ = 0;
  uint32_t leaves_ = 1;
  uint32_t index_bits_ = 0;
  uint64_t index_mask_ = 0;
  std::vector<uint64_t> tree_;  // 1-based heap layout; leaves at [leaves_, 2 leaves_)
};

}  // namespace tutti::dispatch

#endif  // TUTTI_SERVICES_PACKER_CORE_POST_BALANCING_MIN_TREE_H_
