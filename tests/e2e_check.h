// The checks of the end-to-end test (tests/e2e_ranks.cc): one rank's batch
// against its plan, a whole step against the packer's plan for every rank,
// and an exchange whose every byte is derived from the pixels it stands for.
#ifndef TUTTI_TESTS_E2E_CHECK_H_
#define TUTTI_TESTS_E2E_CHECK_H_

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "client/batch.h"
#include "client/client.h"
#include "tutti/v1/job.pb.h"
#include "tutti/v1/plan.pb.h"

namespace tutti::e2e {

// What the checks need from the job config (with defaults filled in).
struct Geometry {
  uint32_t patch = 14;
  uint32_t temporal_patch = 2;
  uint64_t row_values = 0;  // 3 * temporal_patch * patch^2
  int32_t image_pad_id = 0;
  int32_t vision_start_id = 0;
  int32_t vision_end_id = 0;
  uint64_t embedding_bytes_per_token = 0;  // hidden_size * dtype size
};
Geometry GeometryOf(const v1::JobConfig& config);

using ImageKey = std::pair<uint64_t, uint32_t>;  // (sample_id, image_index)

// One image as its encoder rank holds it.
struct ImageFacts {
  uint64_t sample_id = 0;
  uint32_t index = 0;
  uint32_t t = 0, h = 0, w = 0;  // image_grid_thw
  uint64_t rows = 0;             // its rows of pixel_values
  uint32_t crc = 0;              // CRC-32C of those rows' bytes
  uint32_t llm_tokens = 0;       // from the plan
  int32_t rank = -1;             // the encoder rank
  ImageKey key() const { return {sample_id, index}; }
};

// One document of a rank's LLM phase.
struct DocFacts {
  uint64_t sample_id = 0;
  uint32_t length = 0;         // cu_seqlens difference
  uint32_t image_pads = 0;     // image_pad tokens within it
  uint32_t vision_starts = 0;  // vision_start tokens within it
};

// What a rank found in its batch, sent to rank 0 as int64s.
struct RankReport {
  int32_t rank = -1;
  uint64_t plan_hash = 0;  // of the RankPlan the stager delivered
  uint64_t input_ids = 0;
  std::vector<DocFacts> docs;
  std::vector<ImageFacts> images;

  std::vector<int64_t> Encode() const;
  static RankReport Decode(const std::vector<int64_t>& v);
};

// A hash of the plan's deterministic serialization.
uint64_t PlanHash(const v1::RankPlan& plan);

// Checks a batch against the plan it carries (arrays, shapes, grids, token
// counts, document boundaries, no skipped sample) and fills *report.
absl::Status CheckBatch(const Batch& batch, const Geometry& geo, RankReport* report);

// Checks the ranks' reports of one step against the packer's plan for all
// ranks: the global batch split exactly once over the ranks, every image
// encoded exactly once where planned, image pads per document, plans equal.
absl::Status CheckStep(const v1::StepPlan& plan, const v1::JobConfig& config,
                       const std::vector<RankReport>& reports);

// Runs the batch's forward and backward exchange through the client's
// transport (collective: every rank calls it). Each item's bytes derive from
// the CRC of the pixels its encoder holds (`images`, every rank's); every
// received byte is checked, as is that the rank receives exactly the images
// of its own documents with one token per image pad.
absl::Status ExchangeContents(Client& client, const Batch& batch, const Geometry& geo,
                              const std::map<ImageKey, ImageFacts>& images);

}  // namespace tutti::e2e

#endif  // TUTTI_TESTS_E2E_CHECK_H_
