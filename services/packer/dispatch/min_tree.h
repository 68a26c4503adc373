// A tournament tree over a vector of keys: the index of the smallest key
// (ties: lowest index) in O(1), re-reading one changed key in O(log n).
// Masked entries count as +infinity. Not thread-safe.
#ifndef TUTTI_SERVICES_PACKER_DISPATCH_MIN_TREE_H_
#define TUTTI_SERVICES_PACKER_DISPATCH_MIN_TREE_H_

#include <cstdint>
#include <limits>
#include <vector>

namespace tutti::dispatch {

class MinTree {
 public:
  static constexpr uint32_t kNone = ~0u;

  // `keys` must outlive the tree; call Update(i) after keys[i] changes.
  explicit MinTree(const std::vector<double>* keys) : keys_(keys), masked_(keys->size(), 0) {
    const uint32_t n = static_cast<uint32_t>(keys->size());
    leaves_ = 1;
    while (leaves_ < n) leaves_ *= 2;
    tree_.assign(2 * leaves_, Node{kInf, kNone});
    for (uint32_t i = 0; i < n; ++i) tree_[leaves_ + i] = Node{(*keys)[i], i};
    for (uint32_t v = leaves_ - 1; v >= 1; --v) tree_[v] = Pick(tree_[2 * v], tree_[2 * v + 1]);
  }

  void Update(uint32_t i) {
    uint32_t v = leaves_ + i;
    tree_[v] = Node{masked_[i] ? kInf : (*keys_)[i], masked_[i] ? kNone : i};
    for (v /= 2; v >= 1; v /= 2) tree_[v] = Pick(tree_[2 * v], tree_[2 * v + 1]);
  }
  void Mask(uint32_t i, bool masked) {
    masked_[i] = masked;
    Update(i);
  }
  // kNone when every entry is masked (or there are none).
  uint32_t Min() const { return tree_.size() > 1 ? tree_[1].index : kNone; }

 private:
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  struct Node {
    double key;
    uint32_t index;  // kNone: empty or masked
  };
  // Lexicographic (key, index): masked and empty entries are (inf, kNone),
  // so they lose to every real entry and the root is (inf, kNone) when all are.
  static Node Pick(const Node& a, const Node& b) {
    return (b.key < a.key || (b.key == a.key && b.index < a.index)) ? b : a;
  }

  const std::vector<double>* keys_;
  std::vector<uint8_t> masked_;
  uint32_t leaves_ = 1;
  std::vector<Node> tree_;  // 1-based heap layout; leaves at [leaves_, 2 leaves_)
};

}  // namespace tutti::dispatch

#endif  // TUTTI_SERVICES_PACKER_DISPATCH_MIN_TREE_H_
