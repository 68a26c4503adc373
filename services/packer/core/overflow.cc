#include "services/packer/core/overflow.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <queue>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "services/packer/core/radix_sort.h"

namespace tutti::packer {

absl::StatusOr<OverflowPolicy> ResolveOverflowPolicy(const v1::OverflowConfig& c) {
  OverflowPolicy p;
  const std::string& l = c.long_documents();
  if (l.empty() || l == "split") {
    p.long_documents = LongDocuments::kSplit;
  } else if (l == "truncate") {
    p.long_documents = LongDocuments::kTruncate;
  } else if (l == "skip") {
    p.long_documents = LongDocuments::kSkip;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("overflow.long_documents '", l,
                                                   "' is unknown; use 'split' (the default), "
                                                   "'truncate' or 'skip'"));
  }
  if (!(c.max_skip_fraction() >= 0 && c.max_skip_fraction() <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("overflow.max_skip_fraction ",
                                                   c.max_skip_fraction(),
                                                   " must lie in [0, 1] (0 = the default 0.01)"));
  }
  if (c.max_skip_fraction() > 0) p.max_skip_fraction = c.max_skip_fraction();
  if (c.max_deferred_steps() > kMaxDeferredSteps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "overflow.max_deferred_steps ", c.max_deferred_steps(), " is above ", kMaxDeferredSteps,
        " (a restarted packer replays admission from at least twice that many steps back); "
        "set at most ",
        kMaxDeferredSteps, " (0 = the default 8)"));
  }
  if (c.max_deferred_steps() > 0) p.max_deferred_steps = c.max_deferred_steps();
  p.max_deferred_samples = c.max_deferred_samples();
  return p;
}

const char* LongDocumentsName(LongDocuments policy) {
  switch (policy) {
    case LongDocuments::kSplit:
      return "split";
    case LongDocuments::kTruncate:
      return "truncate";
    case LongDocuments::kSkip:
      return "skip";
  }
  return "?";
}

LongDocOutcome ShapeDocument(uint32_t text_tokens, absl::Span<const uint32_t> runs,
                             uint32_t seq_len, LongDocuments policy,
                             std::vector<DocPiece>* pieces) {
  pieces->clear();
  uint64_t total = text_tokens, longest_run = 0;
  for (uint32_t r : runs) total += r, longest_run = std::max<uint64_t>(longest_run, r);
  if (total <= seq_len) {
    pieces->push_back(DocPiece{0, static_cast<uint32_t>(runs.size()), 0, text_tokens,
                               static_cast<uint32_t>(total)});
    return LongDocOutcome::kWhole;
  }
  if (policy == LongDocuments::kSkip || longest_run > seq_len) return LongDocOutcome::kSkipped;
  if (policy == LongDocuments::kTruncate) {
    const uint64_t prefix = total - text_tokens;
    if (prefix > seq_len) return LongDocOutcome::kSkipped;
    pieces->push_back(DocPiece{0, static_cast<uint32_t>(runs.size()), 0,
                               static_cast<uint32_t>(seq_len - prefix), seq_len});
    return LongDocOutcome::kTruncated;
  }
  // Split: fill each piece with whole runs, then text, up to seq_len.
  DocPiece cur;
  uint32_t r = 0, text_left = text_tokens, text_at = 0;
  while (r < runs.size() || text_left > 0) {
    if (r < runs.size()) {
      if (cur.tokens + runs[r] > seq_len) {
        pieces->push_back(cur);
        cur = DocPiece{r, 0, text_at, 0, 0};
      }
      cur.tokens += runs[r];
      ++cur.runs;
      ++r;
      continue;
    }
    if (cur.tokens == seq_len) {
      pieces->push_back(cur);
      cur = DocPiece{r, 0, text_at, 0, 0};
    }
    const uint32_t take = std::min(text_left, seq_len - cur.tokens);
    if (cur.text_tokens == 0) cur.text_begin = text_at;
    cur.text_tokens += take;
    cur.tokens += take;
    text_at += take;
    text_left -= take;
  }
  if (cur.tokens > 0) pieces->push_back(cur);
  // Pieces past the runs start where the text does.
  for (DocPiece& p : *pieces) {
    if (p.runs == 0) p.first_run = static_cast<uint32_t>(runs.size());
  }
  return LongDocOutcome::kSplit;
}

bool DocumentLayout::RunsLead() const {
  for (size_t r = 0; r < runs.size(); ++r) {
    if (text_at[r] != 0 || medium[r] != r) return false;
  }
  return true;
}

LongDocOutcome ShapeDocumentStream(uint32_t text_tokens, const DocumentLayout& doc,
                                   uint32_t seq_len, LongDocuments policy,
                                   std::vector<DocPiece>* pieces) {
  if (doc.RunsLead()) return ShapeDocument(text_tokens, doc.runs, seq_len, policy, pieces);
  pieces->clear();
  const std::vector<uint32_t>& runs = doc.runs;
  const uint32_t R = static_cast<uint32_t>(runs.size());
  uint64_t total = text_tokens, longest_run = 0;
  for (uint32_t r : runs) total += r, longest_run = std::max<uint64_t>(longest_run, r);
  if (total <= seq_len) {
    pieces->push_back(DocPiece{0, R, 0, text_tokens, static_cast<uint32_t>(total)});
    return LongDocOutcome::kWhole;
  }
  if (policy == LongDocuments::kSkip) return LongDocOutcome::kSkipped;
  const bool truncate = policy == LongDocuments::kTruncate;
  if (!truncate && longest_run > seq_len) return LongDocOutcome::kSkipped;
  // The stream in order: the text before run r, run r, ..., the text after
  // the last run. Split starts a piece where the next run or text token
  // does not fit; truncate stops there.
  DocPiece cur;
  uint32_t r = 0, t = 0;
  auto next_piece = [&]() -> bool {
    if (truncate) return false;
    pieces->push_back(cur);
    cur = DocPiece{r, 0, t, 0, 0};
    return true;
  };
  while (r < R || t < text_tokens) {
    const uint32_t text_end = r < R ? doc.text_at[r] : text_tokens;
    if (t < text_end) {
      if (cur.tokens == seq_len && !next_piece()) break;
      const uint32_t take = std::min(text_end - t, seq_len - cur.tokens);
      if (cur.text_tokens == 0) cur.text_begin = t;
      cur.text_tokens += take;
      cur.tokens += take;
      t += take;
      continue;
    }
    if (cur.tokens + runs[r] > seq_len && !next_piece()) break;
    if (cur.runs == 0) cur.first_run = r;
    cur.tokens += runs[r];
    ++cur.runs;
    ++r;
  }
  if (cur.tokens == 0) return LongDocOutcome::kSkipped;  // truncate: its first run is too long
  if (cur.runs == 0) cur.first_run = r;
  pieces->push_back(cur);
  return truncate ? LongDocOutcome::kTruncated : LongDocOutcome::kSplit;
}

absl::Status DocumentRuns(const StageCoster& coster, const Index& ix, uint32_t s,
                          DocumentLayout* doc) {
  doc->Clear();
  thread_local std::vector<MediaPlace> order;
  ix.MediaOrder(s, &order);
  for (const MediaPlace& m : order) doc->images += m.image;
  for (const MediaPlace& m : order) {
    uint32_t tokens;
    if (m.image) {
      auto g = coster.Image(m.media);
      if (!g.ok()) return g.status();
      tokens = g->llm_tokens;
    } else {
      tokens = coster.AudioTokens(ix.media_audio_ms(m.media));
    }
    doc->Add(tokens + 2, m.text_at, m.image ? m.index : doc->images + m.index);
  }
  return absl::OkStatus();
}

PackCertificate::PackCertificate(uint32_t bins, uint32_t seq_len, uint32_t img_cap)
    : bins_(bins),
      seq_len_(std::max<uint32_t>(seq_len, 1)),
      img_cap_(img_cap),
      inv_seq_len_(1.0 / seq_len_),
      inv_img_cap_(img_cap > 0 ? 1.0 / img_cap : 0) {}

// First-fit decreasing fails at an item x only if every bin is fuller than
// kUnit - x. Items above kUnit / 2 ("large", NL of them) go one to a bin, so
// one of them fails only when NL > B. A medium item x (<= kUnit / 2) fails
// only if (a) the items before it, all >= x, weigh more than B (kUnit - x),
// and (b) when NL < B, the medium items before it, the only items of the
// B - NL bins without a large one, weigh more than (B - NL)(kUnit - x). With
// the medium items bucketed by size (1,025 buckets) the items before x weigh
// at most those of x's bucket and above less x, so no item fails when NL <= B
// and for every bucket b holding a medium item, with m its largest,
//   sum(items >= bucket b) <= B kUnit - (B - 1) m, or
//   sum(medium items >= bucket b) <= (B - NL) kUnit - (B - NL - 1) m.
// Each condition only gets easier when an item is removed.
bool PackCertificate::Holds(absl::Span<const uint32_t> sizes) const {
  if (sizes.empty()) return true;
  if (bins_ == 0) return false;
  constexpr uint32_t kShift = 10, kBuckets = (kUnit >> kShift) + 1;
  thread_local std::array<uint64_t, kBuckets> sum;
  thread_local std::array<uint32_t, kBuckets> most;
  sum.fill(0);
  most.fill(0);
  uint64_t total = 0, large_sum = 0, large = 0;
  uint32_t largest = 0;
  for (uint32_t s : sizes) {
    total += s;
    largest = std::max(largest, s);
    if (s > kUnit / 2) {
      ++large;
      large_sum += s;
      continue;
    }
    const uint32_t b = s >> kShift;
    sum[b] += s;
    most[b] = std::max(most[b], s);
  }
  if (large > bins_) return false;
  const uint64_t capacity = bins_ * kUnit;
  // The first-fit bound with the largest item decides most steps at once.
  if (total <= capacity - (bins_ - 1) * uint64_t{largest}) return true;
  const uint64_t rest = bins_ - large;  // bins without a large item
  uint64_t medium = 0;
  for (uint32_t b = kBuckets; b-- > 0;) {
    if (most[b] == 0) continue;
    medium += sum[b];
    const uint64_t m = most[b];
    const bool all = large_sum + medium <= capacity - (bins_ - 1) * m;
    const bool apart = rest > 0 && medium <= rest * kUnit - (rest - 1) * m;
    if (!all && !apart) return false;
  }
  return true;
}

uint32_t PackCertificate::LongestPrefix(absl::Span<const uint32_t> sizes,
                                        absl::Span<const uint32_t> begin) const {
  const uint32_t n = static_cast<uint32_t>(begin.size()) - 1;
  if (Holds(sizes.subspan(0, begin[n]))) return n;
  // Holds is closed under subsets, so it holds for every prefix up to some
  // length and for none beyond.
  uint32_t lo = 0, hi = n;  // holds for lo, not for hi
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    (Holds(sizes.subspan(0, begin[mid])) ? lo : hi) = mid;
  }
  return lo;
}

namespace {

// Max tree over bins' free room: the first bin with room for x in O(log B).
class FirstFit {
 public:
  explicit FirstFit(uint32_t bins) {
    while (leaves_ < bins) leaves_ *= 2;
    room_.assign(2 * leaves_, 0);
    for (uint32_t b = 0; b < bins; ++b) room_[leaves_ + b] = PackCertificate::kUnit;
    for (uint32_t i = leaves_; i-- > 1;) room_[i] = std::max(room_[2 * i], room_[2 * i + 1]);
  }
  // The first bin with room >= x, or -1.
  int64_t Place(uint32_t x) {
    if (room_[1] < x) return -1;
    uint32_t i = 1;
    while (i < leaves_) i = room_[2 * i] >= x ? 2 * i : 2 * i + 1;
    room_[i] -= x;
    for (uint32_t j = i / 2; j >= 1; j /= 2) room_[j] = std::max(room_[2 * j], room_[2 * j + 1]);
    return i - leaves_;
  }

 private:
  uint32_t leaves_ = 1;
  std::vector<uint32_t> room_;
};

// First-fit decreasing of sizes (stable) into `bins`: each item's bin, or
// false when one finds no room.
bool FirstFitDecreasing(absl::Span<const uint32_t> size, uint32_t bins,
                        std::vector<uint32_t>* bin) {
  thread_local std::vector<uint32_t> order;
  order.resize(size.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return size[a] > size[b]; });
  if (bin != nullptr) bin->resize(size.size());
  if (size.empty()) return true;
  if (bins == 0) return false;
  FirstFit ff(bins);
  for (uint32_t i : order) {
    const int64_t b = ff.Place(size[i]);
    if (b < 0) return false;
    if (bin != nullptr) (*bin)[i] = static_cast<uint32_t>(b);
  }
  return true;
}

// FirstFitPacks of the sizes of candidates below `candidates`, from their
// entries in FirstFitPrefix's order.
bool FirstFitPacksSorted(const std::vector<uint64_t>& by_size, uint32_t candidates, uint32_t bins) {
  FirstFit ff(bins);
  for (const uint64_t e : by_size) {
    if (static_cast<uint32_t>(e) >= candidates) continue;
    if (bins == 0 || ff.Place(~static_cast<uint32_t>(e >> 32)) < 0) return false;
  }
  return true;
}

// Packs one stream's items into ranks x seqs bins; slot = rank * seqs + seq.
// `lead` items are packed first-fit with them, ahead of them in order, and
// then left out.
absl::Status PackStream(const char* modality, absl::Span<const PackItem> lead,
                        absl::Span<const PackItem> items, uint32_t ranks, uint32_t seqs,
                        uint32_t seq_len, uint32_t img_cap, std::vector<uint32_t>* slots) {
  slots->assign(items.size(), 0);
  if (items.empty()) return absl::OkStatus();
  const uint32_t bins = ranks * seqs;
  const PackCertificate cert(bins, seq_len, img_cap);
  const size_t L = lead.size();
  std::vector<uint32_t> size(L + items.size());
  uint64_t tokens = 0;
  for (size_t i = 0; i < L; ++i) size[i] = cert.Size(lead[i].tokens, lead[i].image_tokens);
  for (size_t i = 0; i < items.size(); ++i) {
    size[L + i] = cert.Size(items[i].tokens, items[i].image_tokens);
    tokens += items[i].tokens;
  }
  std::vector<uint32_t> bin;
  if (!FirstFitDecreasing(size, bins, &bin)) {
    return CapacityError(modality, tokens, ranks, seqs, seq_len,
                         "first-fit decreasing found no sequence with room");
  }
  bin.erase(bin.begin(), bin.begin() + static_cast<std::ptrdiff_t>(L));
  std::vector<double> cost(bins, 0.0);
  for (size_t i = 0; i < items.size(); ++i) cost[bin[i]] += items[i].llm + items[i].vit;
  // Deal the sequences to ranks: costliest first, onto the least loaded rank
  // that has a sequence left.
  std::vector<uint32_t> by_cost(bins);
  std::iota(by_cost.begin(), by_cost.end(), 0u);
  std::stable_sort(by_cost.begin(), by_cost.end(),
                   [&](uint32_t a, uint32_t b) { return cost[a] > cost[b]; });
  using Entry = std::tuple<double, uint32_t>;  // load, rank
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (uint32_t r = 0; r < ranks; ++r) heap.emplace(0.0, r);
  std::vector<uint32_t> used(ranks, 0), slot_of(bins);
  for (uint32_t b : by_cost) {
    auto [load, r] = heap.top();
    heap.pop();
    slot_of[b] = r * seqs + used[r]++;
    if (used[r] < seqs) heap.emplace(load + cost[b], r);
  }
  for (size_t i = 0; i < items.size(); ++i) (*slots)[i] = slot_of[bin[i]];
  return absl::OkStatus();
}

class FirstFitStrategy final : public PackingStrategy {
 public:
  const std::string& name() const override { return name_; }
  absl::Status Pack(const PackProblem& p, PackResult* r) const override {
    if (absl::Status s = PackStream("text", p.text_lead, p.text, p.ranks, p.text_seqs_per_rank,
                                    p.seq_len, 0, &r->text_slot);
        !s.ok()) {
      return s;
    }
    return PackStream("VL", p.vl_lead, p.vl, p.ranks, p.vl_seqs_per_rank, p.seq_len, p.img_cap,
                      &r->vl_slot);
  }

 private:
  const std::string name_ = "first-fit";
};

}  // namespace

void CandidatePositions(uint64_t step, uint32_t T, uint32_t V, const DeferralQueue& in,
                        uint64_t* out) {
  for (uint64_t p : in.text) *out++ = p;
  for (uint32_t j = 0; j < T; ++j) *out++ = step * T + j;
  for (uint64_t p : in.vl) *out++ = p;
  for (uint32_t j = 0; j < V; ++j) *out++ = step * V + j;
}

bool FirstFitPacks(absl::Span<const uint32_t> sizes, uint32_t bins) {
  return FirstFitDecreasing(sizes, bins, nullptr);
}

// Whether first-fit decreasing packs a prefix depends only on the sizes in
// decreasing order (equal sizes are interchangeable), so the window's sizes
// are sorted once and each probe of the binary search takes those of its
// prefix's candidates from that order.
uint32_t FirstFitPrefix(absl::Span<const uint32_t> sizes, absl::Span<const uint32_t> begin,
                        uint32_t bins) {
  const uint32_t n = static_cast<uint32_t>(begin.size()) - 1;
  // ~size << 32 | candidate: ascending is by decreasing size.
  thread_local std::vector<uint64_t> by_size, tmp;
  by_size.clear();
  for (uint32_t c = 0; c < n; ++c) {
    for (uint32_t k = begin[c]; k < begin[c + 1]; ++k) {
      by_size.push_back(uint64_t{~sizes[k]} << 32 | c);
    }
  }
  RadixSort64(&by_size, &tmp);
  if (FirstFitPacksSorted(by_size, n, bins)) return n;
  uint32_t lo = 0, hi = n;  // packs lo, not hi
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    (FirstFitPacksSorted(by_size, mid, bins) ? lo : hi) = mid;
  }
  return lo;
}

std::unique_ptr<PackingStrategy> MakeFirstFitStrategy() {
  return std::make_unique<FirstFitStrategy>();
}

}  // namespace tutti::packer
