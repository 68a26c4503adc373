// The job the plan and request fuzzers (and their seeds) share: a small
// VL job whose plans the stager lays out and the client exchanges.
#ifndef TUTTI_FUZZ_FUZZ_JOB_H_
#define TUTTI_FUZZ_FUZZ_JOB_H_

namespace tutti::fuzz {

inline constexpr const char* kFuzzJobConfig = R"pb(
  job_id: "fuzz"
  seed: 3
  world_size: 2
  ranks_per_node: 1
  plan_window: 2
  batch {
    text_samples_per_step: 4
    vl_samples_per_step: 4
    grad_accum: 2
    text_micro_batch: 1
    vl_micro_batch: 1
    text_vl_ratio: "1:1"
  }
  curriculum { start_step: 0 max_pixels: 200704 seq_len: 2048 }
  post_balancing { enabled: true }
)pb";

}  // namespace tutti::fuzz

#endif  // TUTTI_FUZZ_FUZZ_JOB_H_
