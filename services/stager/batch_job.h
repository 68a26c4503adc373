// Builds one (step, rank) batch in its shared-memory segment: reads every
// member the rank's plan names (cache or source, each with the sample
// deadline), decodes images straight into pixel_values on the decode pool,
// writes token ids, and applies the skip policy to whatever is corrupt,
// missing or late, so the batch is ready on time with planned shapes
// (substitute) or shrunk ones (drop).
//
// Thread-safe: item callbacks arrive from the reader's and the pool's
// threads; on_ready runs once, on whichever thread settles the last item.
#ifndef TUTTI_SERVICES_STAGER_BATCH_JOB_H_
#define TUTTI_SERVICES_STAGER_BATCH_JOB_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/shm.h"
#include "services/stager/batch_layout.h"
#include "services/stager/decode.h"
#include "services/stager/metrics.h"
#include "services/stager/reader.h"
#include "services/stager/thread_pool.h"
#include "tutti/v1/stager.pb.h"

namespace tutti::stager {

// Recently decoded images and token lists, used as same-modality
// substitutes for samples that fail. Thread-safe.
class SubstitutePool {
 public:
  void OfferImage(uint64_t sample_id, const cv::Mat& bgr);
  void OfferTokens(uint64_t sample_id, const std::vector<int32_t>& tokens);
  // False when nothing is available yet.
  bool TakeImage(uint64_t not_id, cv::Mat* out, uint64_t* id);
  bool TakeTokens(uint64_t not_id, std::vector<int32_t>* out, uint64_t* id);

 private:
  std::mutex mu_;
  std::deque<std::pair<uint64_t, cv::Mat>> images_;                 // guarded by mu_
  std::deque<std::pair<uint64_t, std::vector<int32_t>>> tokens_;    // guarded by mu_
  uint64_t offered_ = 0, taken_ = 0;                                 // guarded by mu_
};

struct BuildContext {
  MemberReader* reader = nullptr;
  ThreadPool* pool = nullptr;
  SubstitutePool* substitutes = nullptr;
  StagerMetrics* metrics = nullptr;  // may be null
  PatchifyParams params;
  const v1::JobConfig* config = nullptr;
  v1::SkipPolicy policy = v1::SKIP_POLICY_SUBSTITUTE;
  absl::Duration deadline = absl::Seconds(2);  // per read + decode
};

class BatchJob : public std::enable_shared_from_this<BatchJob> {
 public:
  using Ready = std::function<void(const std::shared_ptr<BatchJob>&)>;
  BatchJob(BuildContext ctx, std::shared_ptr<const v1::StepPlan> step, int rank_index,
           std::string shm_name);
  ~BatchJob();

  // Lays the batch out (no I/O). INVALID_ARGUMENT for an inconsistent plan.
  absl::Status Plan();
  uint64_t bytes() const { return layout_.total_bytes(); }
  // Creates the segment and starts every read; on_ready runs when done.
  absl::Status Start(Ready on_ready);
  // Safety net: gives up on reads still pending (the reader's own deadlines
  // normally settle them first).
  void Expire();

  uint64_t step() const { return step_->step(); }
  uint32_t rank() const;
  absl::Time started() const { return started_; }
  absl::Time deadline() const { return started_ + ctx_.deadline; }
  // Valid once ready.
  const absl::Status& status() const { return status_; }
  const v1::BatchDescriptor& descriptor() const { return descriptor_; }
  // What is still outstanding, for timeout messages.
  std::string PendingSummary() const;
  // Unlinks the segment's name (once) and skips decodes not started yet; the
  // mapping stays until the job is destroyed, so work in flight never
  // writes into unmapped memory.
  void Discard();

 private:
  enum : int { kReading = 0, kQueued, kDecoding, kDone, kFailed, kAbandoned };
  struct Item {
    std::atomic<int> state{kReading};
    std::string reason, detail;  // when failed
  };
  void ReadImage(size_t i);
  void ReadDoc(size_t d);
  void ReadAudio(size_t a);
  void Fail(Item& item, const absl::Status& s);
  void Settle();
  void Finalize();
  std::string Name(const v1::MemberRef& m, const v1::ShardRef& s) const;

  BuildContext ctx_;
  std::shared_ptr<const v1::StepPlan> step_;
  int rank_index_;
  std::string shm_name_;
  BatchLayout layout_;
  std::unique_ptr<ShmSegment> shm_;
  std::vector<std::unique_ptr<Item>> images_, docs_, audio_;
  std::atomic<int> remaining_{0};
  std::atomic<bool> finalized_{false};
  std::atomic<bool> discarded_{false};
  absl::Time started_;
  Ready on_ready_;
  mutable std::mutex mu_;  // guards Item reason/detail
  absl::Status status_;
  v1::BatchDescriptor descriptor_;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_BATCH_JOB_H_
