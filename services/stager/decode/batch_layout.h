// Where every array of one (step, rank) batch lives in its shared-memory
// segment (see stager.proto, ArrayDesc), computed from the rank's plan before
// anything is read, so images decode straight into their final place.
//
// Pure logic: no I/O.
#ifndef TUTTI_SERVICES_STAGER_DECODE_BATCH_LAYOUT_H_
#define TUTTI_SERVICES_STAGER_DECODE_BATCH_LAYOUT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/media_header.h"
#include "common/sample_json.h"
#include "services/stager/decode/decode.h"
#include "tutti/v1/job.pb.h"
#include "tutti/v1/plan.pb.h"
#include "tutti/v1/stager.pb.h"

namespace tutti {
struct VisionGeometryOptions;
}  // namespace tutti

namespace tutti::stager {

struct ImageItem {
  uint64_t sample_id = 0;
  uint32_t image_index = 0;
  v1::MemberRef member;
  v1::ShardRef shard;
  uint32_t height = 0, width = 0;  // resized, from the plan
  uint32_t grid_t = 1, grid_h = 0, grid_w = 0;
  uint64_t rows = 0;         // patches
  uint64_t offset = 0;       // byte offset of its first row in the segment
  uint64_t bytes = 0;
  uint32_t llm_rank = 0;     // rank whose LLM phase consumes its encoder output
  bool remote_load = false;  // its shard is not staged on this node: read from the source
  std::optional<uint32_t> holder;  // remote_load with locality: the node whose stager holds it
  uint32_t sample_images = 0;  // images of its sample (SampleInfo.images)
};

struct DocItem {
  uint64_t sample_id = 0;
  const v1::SampleInfo* info = nullptr;
  v1::ShardRef shard;
  uint32_t sequence = 0;     // index among the rank's sequences
  uint64_t token_offset = 0; // index of its first token in input_ids
  uint32_t length = 0;       // tokens, as planned
  uint32_t text_offset = 0;  // first text token within the doc (after encoder tokens)
  uint32_t text_length = 0;
  uint32_t text_begin = 0;   // a piece of a split document: its first token of the text
  bool piece = false;        // a piece of a split document (DocSlot.pieces > 0)
  uint32_t image_begin = 0;  // its first entry in doc_image_starts
  uint32_t image_count = 0;  // its images (entries there)
  std::optional<uint32_t> holder;  // remote_load with locality: the node whose stager holds it
};

struct AudioItem {
  uint64_t sample_id = 0;
  uint32_t audio_index = 0;
  v1::MemberRef member;
  v1::ShardRef shard;
  uint64_t samples = 0;   // PCM samples at the configured rate
  uint64_t offset = 0;    // byte offset in the segment
  std::optional<uint32_t> holder;  // remote_load with locality: the node whose stager holds it
};

class BatchLayout {
 public:
  // Validates the plan against itself (every named sample present, image
  // sizes patch-aligned) and lays the arrays out, each 64-byte aligned.
  static absl::StatusOr<BatchLayout> Build(const v1::StepPlan& step, const v1::RankPlan& rank,
                                           const v1::JobConfig& config, const PatchifyParams& params);

  uint64_t total_bytes() const { return total_; }
  const std::vector<ImageItem>& images() const { return images_; }
  const std::vector<DocItem>& docs() const { return docs_; }
  const std::vector<AudioItem>& audio() const { return audio_; }

  // Writes everything known from the plan: grids, ids, offsets and the
  // encoder placeholder tokens of every document.
  void WriteFixed(char* base) const;
  // Writes a document's text tokens fitted to its planned text length.
  void WriteText(char* base, size_t doc, const std::vector<int32_t>& tokens) const;

  // Writes a document from its k.json. A schema-2 document gets its part of
  // the token stream (the whole, a piece of a split one, a truncated one's
  // prefix: its planned text range and the placeholders of its planned
  // images and audio clips, one contiguous stretch of input_ids) in order,
  // each run (vision_start, image_pad x n, vision_end) where its placeholder
  // is, and doc_image_starts saying where; otherwise (no placeholders, a
  // part that is not contiguous, or a run the planned length would cut) the
  // runs lead and the text less its placeholders follows (WriteText).
  // loss_mask is 0 on the tokens outside the document's trained spans.
  void WriteDocument(char* base, size_t doc, const SampleJson& json) const;
  // Removes dropped images, documents and audio clips (compacting the arrays
  // in place) and returns the final array descriptions.
  std::vector<v1::ArrayDesc> Finalize(char* base, const std::vector<bool>& image_dropped,
                                      const std::vector<bool>& doc_dropped,
                                      const std::vector<bool>& audio_dropped) const;

 private:
  struct Array {
    std::string name;
    v1::DType dtype;
    std::vector<uint64_t> shape;  // as planned
    uint64_t offset = 0;
    uint64_t nbytes = 0;
  };
  class PlanSamples;
  // Build's stages.
  absl::Status AddImage(const v1::ImagePlan& ip, const PlanSamples& samples);
  absl::Status AddAudio(const v1::AudioPlan& ap, const PlanSamples& samples);
  absl::Status AddDocument(const v1::DocSlot& slot, uint32_t sequence, uint32_t plan_version,
                           const VisionGeometryOptions& geo, const PlanSamples& samples,
                           uint64_t* tokens);
  void PlaceArrays(uint64_t tokens);
  Array& Add(const std::string& name, v1::DType dtype, std::vector<uint64_t> shape, uint64_t elem);
  const Array& Get(const std::string& name) const;

  v1::VisionConfig vision_;
  v1::AudioConfig audio_cfg_;
  PatchifyParams params_;
  std::vector<ImageItem> images_;
  std::vector<DocItem> docs_;
  std::vector<AudioItem> audio_;
  std::vector<uint32_t> seq_docs_;     // documents per sequence
  std::vector<uint32_t> mb_seqs_;      // sequences per micro-batch
  std::vector<std::vector<std::pair<uint32_t, bool>>> doc_encoders_;  // per doc: (tokens, is_audio)
  std::vector<std::vector<uint32_t>> doc_media_;  // per doc: each entry's image/audio index
  std::vector<Array> arrays_;
  uint64_t doc_images_ = 0;  // entries of doc_image_starts
  uint64_t total_ = 0;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_DECODE_BATCH_LAYOUT_H_
