// Test fixtures: real WebDataset shards (TarWriter + cv::imencode) and the
// JobInfo / StepPlan protos a packer would send for them.
#ifndef TUTTI_SERVICES_STAGER_TEST_DATASET_H_
#define TUTTI_SERVICES_STAGER_TEST_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/v1/packer.pb.h"
#include "tutti/v1/plan.pb.h"

namespace tutti::stager::testing {

struct DatasetSpec {
  int shards = 2;
  int samples_per_shard = 4;
  int width = 200, height = 150;  // source image size
  const char* ext = ".jpg";
  int text_tokens = 12;
  bool crc = true;                // record CRC-32C in the shard and member refs
  uint32_t audio_ms = 0;          // > 0: every sample also holds k.wav of this length
  uint32_t audio_rate = 8000;     // its sample rate (PCM16 mono)
  // k.json in schema 2: the image's placeholder (151655, the default
  // image_pad_id) after the first text_tokens / 2 ids, the rest trained.
  bool schema2 = false;
};

// Sample n of the test clips: PCM16 of a 440 Hz sine.
int16_t TestPcm(uint64_t n, uint32_t rate);

struct Dataset {
  std::string dir;
  std::vector<v1::ShardRef> shards;
  std::vector<v1::SampleInfo> samples;  // sample_id == index; shard = index into `shards`
};

// Writes the shards under dir (created). Sample i's k.json holds input_ids
// 1000*i + 0..text_tokens-1.
Dataset WriteDataset(const std::string& dir, const DatasetSpec& spec);

v1::JobInfo MakeJob(const Dataset& data, uint32_t world_size, uint32_t ranks_per_node,
                    uint64_t max_pixels = 50176);

// The plan of `step` for `ranks` (empty: all): rank r of step s gets
// `per_rank` consecutive VL samples (wrapping), one image each (and one audio
// clip each when the dataset has audio, in an audio encoder phase), in one VL
// micro-batch with one sequence.
v1::StepPlan MakePlan(const Dataset& data, const v1::JobInfo& job, uint64_t step,
                      const std::vector<uint32_t>& ranks, int per_rank);

}  // namespace tutti::stager::testing

#endif  // TUTTI_SERVICES_STAGER_TEST_DATASET_H_
