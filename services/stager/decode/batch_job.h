// Builds one (step, rank) batch in its shared-memory segment: reads every
// member the rank's plan names (cache or source, each with the sample
// deadline), decodes images straight into pixel_values on the decode pool,
// writes token ids, and applies the skip policy to whatever is corrupt,
// missing or late, so the batch is ready on time with planned shapes
// (substitute) or shrunk ones (drop).
//
// Thread-safe: item callbacks arrive from the reader's and the pool's
// threads; on_ready runs once, on whichever thread settles the last item.
// The window (batch_window.h) holds it as a WindowBatch.
#ifndef TUTTI_SERVICES_STAGER_DECODE_BATCH_JOB_H_
#define TUTTI_SERVICES_STAGER_DECODE_BATCH_JOB_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <opencv2/core.hpp>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/shm.h"
#include "services/stager/decode/batch_layout.h"
#include "services/stager/decode/decode.h"
#include "services/stager/decode/thread_pool.h"
#include "services/stager/member_peers.h"
#include "services/stager/metrics.h"
#include "services/stager/staging/reader.h"
#include "services/stager/window/batch_window.h"
#include "tutti/v1/stager.pb.h"

namespace tutti::stager {

struct BuildContext {
  MemberReader* reader = nullptr;
  ThreadPool* pool = nullptr;
  StagerMetrics* metrics = nullptr;  // may be null
  PatchifyParams params;
  const v1::JobConfig* config = nullptr;
  v1::SkipPolicy policy = v1::SKIP_POLICY_SUBSTITUTE;
  absl::Duration deadline = absl::Seconds(2);  // per read + decode
  ShmAccess segment_access;                    // who may map the batch segments
  // The stagers of other nodes, asked first for a remote_load item's member
  // when the plan names its holder (may be null: always the source).
  MemberPeers* peers = nullptr;
  // How long the holder has, from when the read starts; the rest of the
  // sample deadline is the source's. Zero: half of what is left of it.
  absl::Duration peer_timeout = absl::ZeroDuration();
  // The rate limit of the "skipped a sample member" lines, one per stager
  // (so two stagers in one process, as in tests, do not use up each
  // other's). Null: one for the whole process.
  LogRateLimit* skip_log = nullptr;
};

class BatchJob final : public WindowBatch, public std::enable_shared_from_this<BatchJob> {
 public:
  using Ready = std::function<void(const std::shared_ptr<BatchJob>&)>;
  // on_ready runs once the batch is built (see Start).
  BatchJob(BuildContext ctx, std::shared_ptr<const v1::StepPlan> step, int rank_index,
           std::string shm_name, Ready on_ready);
  ~BatchJob() override;

  // Lays the batch out (no I/O). INVALID_ARGUMENT for an inconsistent plan.
  absl::Status Plan();
  uint64_t bytes() const override { return layout_.total_bytes(); }
  // Creates the segment and starts every read; on_ready runs when done.
  absl::Status Start() override;
  // Safety net: gives up on reads still pending (the reader's own deadlines
  // normally settle them first).
  void Expire() override;

  uint64_t step() const override { return step_->step(); }
  uint32_t rank() const override;
  absl::Time started() const override { return started_; }
  absl::Time deadline() const override { return started_ + ctx_.deadline; }
  // Valid once ready.
  const v1::BatchDescriptor& descriptor() const override { return descriptor_; }
  // What is still outstanding, for timeout messages.
  std::string PendingSummary() const override;
  // Unlinks the segment's name (once) and skips decodes not started yet; the
  // mapping stays until the job is destroyed, so work in flight never
  // writes into unmapped memory.
  void Discard() override;

 private:
  enum : int { kReading = 0, kQueued, kDecoding, kDone, kFailed, kAbandoned };
  struct Item {
    std::atomic<int> state{kReading};
    absl::Mutex mu;  // the failure is written by one thread, read by Finalize
    std::string reason ABSL_GUARDED_BY(mu);  // when failed
    std::string detail ABSL_GUARDED_BY(mu);
    // A document's k.json "source" and compact "meta", passed to the trainer.
    std::string source ABSL_GUARDED_BY(mu);
    std::string meta ABSL_GUARDED_BY(mu);
    bool done() const { return state.load() == kDone; }
  };
  // Which samples of the batch failed, and which of them cross ranks (an item
  // encoded for, or by, another rank): those cannot leave the batch.
  struct Failures {
    std::set<uint64_t> failed, crossing;
  };
  class Outcome;  // records skipped members and counts each sample once

  // Reads a member for this batch, checked against its checksum (see .cc).
  void ReadChecked(const v1::ShardRef& shard, const v1::MemberRef& member,
                   MemberReader::Done done);
  // A member of an item: from `holder`'s stager first when the plan names
  // one this stager can ask (its bytes checked against the index), then,
  // when that fails or runs late, ReadChecked. Each member is asked of the
  // holder at most once.
  void ReadItem(const v1::ShardRef& shard, const v1::MemberRef& member,
                std::optional<uint32_t> holder, MemberReader::Done done);
  // OK, or RESOURCE_EXHAUSTED naming the bound image i's plan exceeds.
  absl::Status CheckImageLimits(size_t i);
  void ReadImage(size_t i);
  void DecodeImage(size_t i, const std::string& data);
  void ReadDoc(size_t d);
  void ReadAudio(size_t a);
  void Fail(Item& item, const absl::Status& s);
  // " (N image decodes were waiting for the T decode threads then)", or ""
  // when none waited: beside a deadline, whether the host was short of CPU.
  std::string DecodeBacklog() const;
  void Settle();
  // Runs once every item settled: applies the skip policy, describes the batch.
  void Finalize();
  Failures FindFailures() const;
  void SettleImages(Outcome& out, std::vector<bool>* dropped);
  void SettleDocs(Outcome& out, std::vector<bool>* dropped);
  void SettleAudio(Outcome& out, std::vector<bool>* dropped);
  void Describe(const std::vector<bool>& image_dropped, const std::vector<bool>& doc_dropped,
                const std::vector<bool>& audio_dropped, const std::set<uint64_t>& named);
  std::string Name(const v1::MemberRef& m, const v1::ShardRef& s) const;

  BuildContext ctx_;
  std::shared_ptr<const v1::StepPlan> step_;
  int rank_index_;
  std::string shm_name_;
  Ready on_ready_;
  BatchLayout layout_;
  std::unique_ptr<ShmSegment> shm_;
  std::vector<std::unique_ptr<Item>> images_, docs_, audio_;
  std::atomic<int> remaining_{0};
  std::atomic<bool> finalized_{false};
  std::atomic<bool> discarded_{false};
  absl::Time started_;
  // Written by Finalize before on_ready; read after it.
  v1::BatchDescriptor descriptor_;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_DECODE_BATCH_JOB_H_
