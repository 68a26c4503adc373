// The overflow policy: what becomes of a document longer than its stage's
// seq_len, and of samples a step cannot fit (job.proto OverflowConfig;
// services/packer/README.md, "Overflow").
//
// Long documents: "split" into consecutive pieces of at most seq_len tokens
// (a run, an encoder output with its two markers, is never cut), "truncate"
// or "skip". A document's layout is its token stream: a schema-2 sample's
// runs where its placeholders are (the index's MPOS), else its image runs,
// its audio runs, then its text. Split fills each piece in that order, a
// piece boundary only between runs and text or inside the text; truncate
// keeps the longest prefix that cuts no run (the runs past the cut are
// dropped: not planned, never decoded). Where the runs lead, truncate keeps
// every run and cuts the text. What cannot be split or truncated (a run
// longer than seq_len where it would be placed) is skipped.
//
// Deferral: each stream's candidates for a step are the samples still waiting
// from earlier steps (oldest first) followed by the step's own draw; both are
// stream positions, and what waits is always a contiguous range of them, so a
// stream's state is one number, its frontier f (positions below f are
// planned or skipped). A step admits candidates [f, c) and the rest waits:
//   c(f) = max(f, the longest prefix the bound certifies (PackCertificate),
//              max over window starts g <= f of F(g)),
// where F(g) is the longest prefix of [g, end) that first-fit decreasing on
// each item's size s = max(tokens / seq_len, image tokens / img_cap) packs
// into the stream's W x sequences bins (a binary search, never past a sample
// repeated in [g, end)), and g runs over fixed window starts: each step's
// draw cut into at most kWindowStarts equal parts. F(g) depends on g alone,
// so c is monotone in f; what c admits packs (first-fit decreasing packs the
// window [g, c), so also its part [f, c): the fallback packs the items of
// [g, f) with it and drops them). Monotone admission makes the frontier
// entering step k recoverable from a bounded window of earlier steps
// (planner.h).
#ifndef TUTTI_SERVICES_PACKER_CORE_OVERFLOW_H_
#define TUTTI_SERVICES_PACKER_CORE_OVERFLOW_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "services/packer/core/costs.h"
#include "services/packer/core/packing.h"
#include "services/packer/core/plan_data.h"
#include "tutti/v1/job.pb.h"

namespace tutti::packer {

enum class LongDocuments { kSplit, kTruncate, kSkip };

struct OverflowPolicy {
  LongDocuments long_documents = LongDocuments::kSplit;  // default "split"
  double max_skip_fraction = 0.01;                       // default 0.01
  uint32_t max_deferred_steps = 8;                       // default 8, at most 64
  uint64_t max_deferred_samples = 0;                     // 0: one step's draw of both streams
};
inline constexpr uint32_t kMaxDeferredSteps = 64;

// The policy of `config` with defaults for unset fields. INVALID_ARGUMENT
// naming a bad value.
absl::StatusOr<OverflowPolicy> ResolveOverflowPolicy(const v1::OverflowConfig& config);
const char* LongDocumentsName(LongDocuments policy);

// One piece of a document: runs [first_run, first_run + runs) of its run
// list (DocumentLayout order) and text tokens [text_begin, text_begin +
// text_tokens).
struct DocPiece {
  uint32_t first_run = 0, runs = 0;
  uint32_t text_begin = 0, text_tokens = 0;
  uint32_t tokens = 0;  // LLM tokens: runs (each with its markers) + text
};

enum class LongDocOutcome { kWhole, kSplit, kTruncated, kSkipped };

// A document's runs in the order of its token stream: each run's LLM
// tokens including its two markers, the text tokens before it
// (non-decreasing) and which medium it is (images, then audio clips: image i
// is i, audio clip a is images + a).
struct DocumentLayout {
  std::vector<uint32_t> runs, text_at, medium;
  uint32_t images = 0;
  void Clear() {
    runs.clear();
    text_at.clear();
    medium.clear();
    images = 0;
  }
  void Add(uint32_t tokens, uint32_t text_before, uint32_t which) {
    runs.push_back(tokens);
    text_at.push_back(text_before);
    medium.push_back(which);
  }
  // Whether the runs lead, images then audio clips (a sample without
  // placeholders, or whose placeholders all lead).
  bool RunsLead() const;
};

// The document of `text_tokens` text tokens and the runs of `doc`, for
// `seq_len`: kWhole (one piece, as it is) when it fits; else as `policy`
// says (see above), or kSkipped when it cannot be.
LongDocOutcome ShapeDocumentStream(uint32_t text_tokens, const DocumentLayout& doc,
                                   uint32_t seq_len, LongDocuments policy,
                                   std::vector<DocPiece>* pieces);
// The same for a document whose runs lead (`runs`: each run's LLM tokens
// including its two markers).
LongDocOutcome ShapeDocument(uint32_t text_tokens, absl::Span<const uint32_t> runs,
                             uint32_t seq_len, LongDocuments policy, std::vector<DocPiece>* pieces);

// A sample's runs at a stage in the order of its token stream
// (Index::MediaOrder): each image's LLM tokens + 2, each audio clip's.
absl::Status DocumentRuns(const StageCoster& coster, const Index& index, uint32_t sample,
                          DocumentLayout* doc);

// The admission certificate over items of one stream (see above).
class PackCertificate {
 public:
  // `bins`: W x the stream's sequences per rank; img_cap 0 = no cap.
  PackCertificate(uint32_t bins, uint32_t seq_len, uint32_t img_cap);
  // An item's size in fixed point (kUnit = a whole sequence).
  uint32_t Size(uint32_t tokens, uint32_t image_tokens) const {
    uint32_t s = Scaled(tokens, seq_len_, inv_seq_len_);
    if (img_cap_ > 0) s = std::max(s, Scaled(image_tokens, img_cap_, inv_img_cap_));
    return s;
  }
  // Whether first-fit decreasing certainly packs items of these sizes.
  bool Holds(absl::Span<const uint32_t> sizes) const;
  // The longest prefix of candidates (candidate c holds sizes
  // [begin[c], begin[c + 1])) whose items certainly pack; begin has
  // candidates + 1 entries.
  uint32_t LongestPrefix(absl::Span<const uint32_t> sizes, absl::Span<const uint32_t> begin) const;

  uint32_t bins() const { return static_cast<uint32_t>(bins_); }

  static constexpr uint32_t kUnit = 1u << 20;

 private:
  // min(kUnit, ceil(x kUnit / cap)) without a division (one a candidate
  // and constraint of every step): the quotient through the reciprocal,
  // corrected to the exact one.
  static uint32_t Scaled(uint64_t x, uint64_t cap, double inv) {
    if (x >= cap) return kUnit;
    const uint64_t n = x * kUnit + cap - 1;  // < 2^52: exact as a double
    uint64_t q = static_cast<uint64_t>(static_cast<double>(n) * inv);
    while (q > 0 && q * cap > n) --q;
    while ((q + 1) * cap <= n) ++q;
    return static_cast<uint32_t>(q);
  }

  uint64_t bins_;
  uint32_t seq_len_, img_cap_;
  double inv_seq_len_, inv_img_cap_;
};

// A step's candidate stream positions: the text queue, the step's own text
// draw [step * T, (step + 1) * T), then the same for VL; out has
// in.size() + T + V entries.
void CandidatePositions(uint64_t step, uint32_t T, uint32_t V, const DeferralQueue& in,
                        uint64_t* out);

// Whether first-fit decreasing (stable: equal sizes in the given order)
// packs items of these sizes into `bins` bins of PackCertificate::kUnit.
bool FirstFitPacks(absl::Span<const uint32_t> sizes, uint32_t bins);

// The longest prefix of candidates (candidate c holds sizes [begin[c],
// begin[c + 1])) that first-fit decreasing packs into `bins`, found by
// binary search over the prefix length (first-fit is not monotone in its
// items, so this is a canonical prefix, not necessarily the longest).
uint32_t FirstFitPrefix(absl::Span<const uint32_t> sizes, absl::Span<const uint32_t> begin,
                        uint32_t bins);

// Window starts per step and stream (see above).
inline constexpr uint32_t kWindowStarts = 64;

// The fallback packing: first-fit decreasing on the certificate's sizes, the
// sequences then dealt to ranks by decreasing LLM cost onto the least loaded
// rank with a free sequence. The problem's lead items (the admission's window
// before the admitted candidates) are packed first-fit with the items and
// then left out. Packs every set admission admits.
std::unique_ptr<PackingStrategy> MakeFirstFitStrategy();

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_OVERFLOW_H_
