#include "services/stager/stager_core.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "common/shm.h"
#include "gtest/gtest.h"
#include "services/stager/test_dataset.h"

namespace tutti::stager {
namespace {

namespace fs = std::filesystem;

// Directories Fresh made in this process, removed when its tests end.
std::vector<std::string>& FreshDirs() {
  static auto* dirs = new std::vector<std::string>;
  return *dirs;
}

class RemoveFreshDirs : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const std::string& dir : FreshDirs()) {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  }
};
::testing::Environment* const kRemoveFreshDirs =
    ::testing::AddGlobalTestEnvironment(new RemoveFreshDirs);

std::string Fresh(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/core_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  FreshDirs().push_back(dir);
  return dir;
}

const v1::ArrayDesc& Array(const v1::BatchDescriptor& d, const std::string& name) {
  for (const auto& a : d.arrays()) {
    if (a.name() == name) return a;
  }
  static v1::ArrayDesc none;
  ADD_FAILURE() << "no array " << name;
  return none;
}

// Segments of this process only: the same test may run in another build's
// suite on the same machine at the same time.
int ShmSegmentsOf(const std::string& job_prefix) {
  const std::string prefix = job_prefix + "-" + std::to_string(::getpid()) + "-";
  int n = 0;
  for (const auto& e : fs::directory_iterator("/dev/shm")) {
    n += e.path().filename().string().rfind(prefix, 0) == 0;
  }
  return n;
}

struct Core {
  testing::Dataset data;
  v1::JobInfo job;
  std::unique_ptr<StagerCore> core;
  std::shared_ptr<StagerMetrics> metrics;

  Core(const std::string& name, testing::DatasetSpec spec, StagerOptions o = {},
       std::vector<IoFault> stage_faults = {}, std::vector<IoFault> read_faults = {},
       std::function<void(testing::Dataset&)> damage = nullptr,
       std::function<void(v1::JobConfig&)> configure = nullptr) {
    const std::string root = Fresh(name);
    data = testing::WriteDataset(root + "/src", spec);
    if (damage) damage(data);
    job = testing::MakeJob(data, 4, 2);
    job.mutable_config()->set_job_id("coretest-" + name);
    if (configure) configure(*job.mutable_config());
    o.node = 1;
    o.cache_dir = root + "/cache";
    o.staging.source_dir = data.dir;
    o.staging.queue_depth = 8;
    o.staging.block_size = 65536;
    o.staging.op_timeout = absl::Milliseconds(400);
    o.decode_threads = 2;
    o.window = 2;
    o.stage_ahead = 2;
    std::unique_ptr<IoBackend> sb, rb;
    if (!stage_faults.empty()) {
      sb = std::make_unique<FaultInjectingBackend>(std::move(*MakeUringBackend(64)), stage_faults);
    }
    if (!read_faults.empty()) {
      rb = std::make_unique<FaultInjectingBackend>(std::move(*MakeUringBackend(64)), read_faults);
    }
    metrics = std::make_shared<StagerMetrics>(std::make_shared<prometheus::Registry>());
    core = std::make_unique<StagerCore>(o, metrics, std::move(sb), std::move(rb));
    absl::Status s = core->Start(job);
    EXPECT_TRUE(s.ok()) << s;
  }
  // The first image of ip's sample, decoded straight from its source shard
  // to ip's planned size: what a batch must hold for it ("" on failure).
  std::string DecodeDirectly(const v1::ImagePlan& ip) const {
    const auto& info = data.samples[ip.sample_id()];
    auto shard = ReadFileToString(data.dir + "/" + data.shards[info.shard()].name());
    EXPECT_TRUE(shard.ok()) << shard.status();
    if (!shard.ok()) return "";
    const PatchifyParams p = PatchifyParams::FromConfig(job.config().vision());
    std::string out(p.ImageBytes(ip.resized_height(), ip.resized_width()), '\0');
    auto decoded = DecodeImageInto(shard->substr(info.images(0).offset(), info.images(0).size()),
                                   "x", ImageKind::kJpeg, ip.resized_height(), ip.resized_width(),
                                   p, out.data());
    EXPECT_TRUE(decoded.ok()) << decoded.status();
    return decoded.ok() ? out : "";
  }
  void Plans(uint64_t from, uint64_t to, int per_rank = 3,
             std::function<void(v1::StepPlan&)> edit = nullptr) {
    for (uint64_t s = from; s < to; ++s) {
      v1::StepPlan plan = testing::MakePlan(data, job, s, {2, 3}, per_rank);
      if (edit) edit(plan);
      absl::Status st = core->AddPlan(std::move(plan), 0);
      ASSERT_TRUE(st.ok()) << st;
    }
  }
};

TEST(StagerCoreTest, BatchMatchesADirectDecodeAndTokens) {
  Core c("e2e", {.shards = 2, .samples_per_shard = 6});
  c.Plans(0, 2);
  auto d = c.core->Acquire(0, 3, 20000);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->skipped_size(), 0);
  auto seg = ShmSegment::Open(d->shm_name(), false);
  ASSERT_TRUE(seg.ok());
  // The first image of rank 3 at step 0, decoded directly.
  const auto& ip = d->plan().encoders(0).images(0);
  const std::string direct = c.DecodeDirectly(ip);
  ASSERT_FALSE(direct.empty());
  const auto& pv = Array(*d, "pixel_values");
  EXPECT_EQ(0, std::memcmp((*seg)->data() + pv.offset(), direct.data(), direct.size()));
  const auto& grid = Array(*d, "image_grid_thw");
  const int32_t* g = reinterpret_cast<const int32_t*>((*seg)->data() + grid.offset());
  EXPECT_EQ(g[1], static_cast<int32_t>(ip.grid_h()));
  // Text tokens of the first document follow its image tokens.
  const auto& ids = Array(*d, "input_ids");
  const int32_t* t = reinterpret_cast<const int32_t*>((*seg)->data() + ids.offset());
  const auto& doc = d->plan().micro_batches(0).sequences(0).docs(0);
  const uint32_t text_at = doc.encoder_tokens() + 2;
  EXPECT_EQ(t[0], 151652);
  EXPECT_EQ(t[text_at], static_cast<int32_t>(1000 * doc.sample_id()));
  EXPECT_EQ(t[text_at + 5], static_cast<int32_t>(1000 * doc.sample_id() + 5));
  EXPECT_EQ(d->samples_size(), 3);
  // Errors clients can make.
  auto wrong_rank = c.core->Acquire(0, 0, 100);
  EXPECT_EQ(wrong_rank.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_rank.status().message().find("rank 0 belongs to node 0 but this tutti-stagerd serves node 1 (ranks 2..3)"), std::string::npos) << wrong_rank.status();
  ASSERT_TRUE(c.core->Release(0, 3).ok());
  auto again = c.core->Acquire(0, 3, 100);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(c.core->Acquire(1, 3, 20000).ok());  // held from here on
  auto waits = [&] { return c.metrics->acquire_wait_seconds.Collect().histogram; };
  const uint64_t waits_before = waits().sample_count;
  const double waited_before = waits().sample_sum;
  auto far = c.core->Acquire(40, 3, 100);  // waits for the window, which rank 3 keeps at step 0
  EXPECT_EQ(far.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(far.status().message().find("rank 3 holds step 1"), std::string::npos)
      << far.status();
  // A wait outside the window is an AcquireBatch wait like any other.
  EXPECT_EQ(waits().sample_count, waits_before + 1);
  EXPECT_GE(waits().sample_sum - waited_before, 0.1);
  auto late = c.core->Acquire(3, 3, 300);  // plans only up to step 1
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(late.status().message().find("no plan for step 3"), std::string::npos) << late.status();
  c.core->PlanFailed(2, absl::OutOfRangeError("step 2 is past the dataset's end"), 0);
  auto gone = c.core->Acquire(2, 2, 300);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kOutOfRange) << gone.status();
  EXPECT_NE(gone.status().message().find("packer cannot serve step 2"), std::string::npos);
  // This process's segments only (a killed earlier run may have left its own).
  EXPECT_GT(ShmSegmentsOf("tutti-coretest-e2e"), 0);
  c.core->Stop();
  EXPECT_EQ(ShmSegmentsOf("tutti-coretest-e2e"), 0);
}

TEST(StagerCoreTest, SourceWithoutTheJobsShardsIsRefusedAtStart) {
  // --source pointing at the wrong directory (or an unmounted mount point).
  const std::string root = Fresh("nosource");
  testing::Dataset data = testing::WriteDataset(root + "/src", {.shards = 2, .samples_per_shard = 4});
  v1::JobInfo job = testing::MakeJob(data, 4, 2);
  job.mutable_config()->set_job_id("coretest-nosource");
  fs::create_directories(root + "/elsewhere");
  StagerOptions o;
  o.node = 1;
  o.cache_dir = root + "/cache";
  o.staging.source_dir = root + "/elsewhere";
  auto metrics = std::make_shared<StagerMetrics>(std::make_shared<prometheus::Registry>());
  StagerCore core(o, metrics);
  absl::Status s = core.Start(job);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("--source " + root + "/elsewhere holds none of the job's shards"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find(data.shards[0].name()), std::string::npos) << s;
  // One shard of two gone: a warning, the daemon starts.
  fs::remove(data.dir + "/" + data.shards[1].name());
  o.staging.source_dir = data.dir;
  o.cache_dir = root + "/cache2";
  StagerCore partial(o, metrics);
  EXPECT_TRUE(partial.Start(job).ok());
}

TEST(StagerCoreTest, SegmentsLeftByThePreviousDaemonOfTheCacheAreRemovedOnlyThose) {
  // The previous daemon of this cache directory crashed, leaving a batch; a
  // live daemon of another cache (same job id, same node) has one too.
  const std::string stale = absl::StrCat("/tutti-coretest-stale-", ::getpid(), "-0badf00d");
  const std::string other = absl::StrCat("/tutti-coretest-stale-", ::getpid(), "-0badf00e");
  ASSERT_TRUE(ShmSegment::Create(stale + "-n1-r2-s7", 64).ok());
  ASSERT_TRUE(ShmSegment::Create(other + "-n1-r2-s7", 64).ok());
  Core c("stale", {.shards = 1, .samples_per_shard = 6}, {}, {}, {}, [&](testing::Dataset& d) {
    const std::string cache = fs::path(d.dir).parent_path().string() + "/cache";
    fs::create_directories(cache);
    ASSERT_TRUE(WriteFileAtomically(cache + "/" + SegmentNames::kRecordFile, stale + "\n").ok());
  });
  EXPECT_FALSE(ShmSegment::Open(stale + "-n1-r2-s7", false).ok());
  EXPECT_TRUE(ShmSegment::Open(other + "-n1-r2-s7", false).ok());
  ShmSegment::Unlink(other + "-n1-r2-s7");
  // This daemon's batches carry its own prefix, now the one recorded; the
  // record is not taken for a cached shard.
  c.Plans(0, 1);
  auto d = c.core->Acquire(0, 2, 20000);
  ASSERT_TRUE(d.ok()) << d.status();
  auto record = ReadFileToString(c.core->cache()->dir() + "/" + SegmentNames::kRecordFile);
  ASSERT_TRUE(record.ok());
  const std::string prefix = record->substr(0, record->find('\n'));
  EXPECT_EQ(d->shm_name(), prefix + "-n1-r2-s0");
  EXPECT_NE(prefix.find(absl::StrCat("/tutti-coretest-stale-", ::getpid(), "-")), std::string::npos);
  EXPECT_NE(prefix, stale);
  EXPECT_EQ(c.core->cache()->cached_files(), 1u);
}

TEST(StagerCoreTest, RanksResumingInsideTheWindowGiveUpTheEarlierSteps) {
  // A job resumed from a checkpoint at step 1 on a fresh daemon (window 0..1,
  // plans held up to step 3): step 0 is never taken, and the window must
  // still move on.
  Core c("resume", {.shards = 2, .samples_per_shard = 6});
  c.Plans(0, 4);
  for (uint64_t step = 1; step < 3; ++step) {
    for (uint32_t r : {2u, 3u}) {
      auto d = c.core->Acquire(step, r, 20000);
      ASSERT_TRUE(d.ok()) << "step " << step << " rank " << r << ": " << d.status();
      EXPECT_EQ(d->step(), step);
      ASSERT_TRUE(c.core->Release(step, r).ok());
    }
  }
  c.Plans(4, 5);  // the window starts at step 3 now: room for more plans
  // A batch a rank holds is not given up by asking for a later step.
  auto held = c.core->Acquire(3, 2, 20000);
  ASSERT_TRUE(held.ok()) << held.status();
  auto later = c.core->Acquire(5, 2, 100);  // no plan for step 5 yet: times out
  EXPECT_EQ(later.status().code(), absl::StatusCode::kDeadlineExceeded) << later.status();
  EXPECT_TRUE(ShmSegment::Open(held->shm_name(), false).ok());
  auto other = c.core->Acquire(3, 3, 20000);
  EXPECT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(c.core->Release(3, 2).ok());
  EXPECT_TRUE(c.core->Release(3, 3).ok());
}

TEST(StagerCoreTest, BatchesStayWithinTheMemoryBudget) {
  // The sizes of two batches of step 0, from a daemon without a tight budget.
  uint64_t a = 0, b = 0;
  {
    Core sizes("budget-sizes", {.shards = 2, .samples_per_shard = 6});
    sizes.Plans(0, 2);
    auto da = sizes.core->Acquire(0, 2, 20000);
    auto db = sizes.core->Acquire(0, 3, 20000);
    ASSERT_TRUE(da.ok() && db.ok());
    a = da->shm_size(), b = db->shm_size();
  }
  // Room for either batch but not both: the second is built only once the
  // first is released, and the memory in use never passes the budget.
  StagerOptions o;
  o.memory_budget_bytes = std::max(a, b) + std::min(a, b) / 2;
  Core c("budget", {.shards = 2, .samples_per_shard = 6}, o);
  c.Plans(0, 2);
  auto first = c.core->Acquire(0, 2, 20000);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = c.core->Acquire(0, 3, 500);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kDeadlineExceeded) << second.status();
  EXPECT_NE(second.status().message().find("memory budget"), std::string::npos) << second.status();
  EXPECT_LE(c.metrics->batch_memory.Value(), static_cast<double>(o.memory_budget_bytes));
  ASSERT_TRUE(c.core->Release(0, 2).ok());
  second = c.core->Acquire(0, 3, 20000);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_LE(c.metrics->batch_memory.Value(), static_cast<double>(o.memory_budget_bytes));

  // A batch larger than the whole budget fails at once, saying what to raise.
  StagerOptions tiny;
  tiny.memory_budget_bytes = 1024;
  Core t("budget-tiny", {.shards = 2, .samples_per_shard = 6}, tiny);
  t.Plans(0, 1);
  auto too_big = t.core->Acquire(0, 2, 20000);
  EXPECT_FALSE(too_big.ok());
  EXPECT_NE(too_big.status().message().find("raise --memory_budget"), std::string::npos)
      << too_big.status();
}

TEST(StagerCoreTest, WindowMovesToAnyStepWhileWhatIsInUseStaysInsideIt) {
  // A job resuming from a checkpoint asks for an earlier (or much later)
  // step than the daemon had got to: the window moves there, as long as
  // every batch held or waited for stays inside it.
  Core c("seek", {.shards = 2, .samples_per_shard = 6});
  c.Plans(0, 3);
  for (uint64_t step = 0; step < 2; ++step) {
    for (uint32_t r : {2u, 3u}) {
      ASSERT_TRUE(c.core->Acquire(step, r, 20000).ok());
      ASSERT_TRUE(c.core->Release(step, r).ok());
    }
  }
  // Back to step 0: nothing is held, so the window moves and asks for plans again.
  std::optional<absl::StatusOr<v1::BatchDescriptor>> back;
  std::mutex m;
  c.core->AcquireAsync(0, 2, 20000, [&](absl::StatusOr<v1::BatchDescriptor> r) {
    std::lock_guard<std::mutex> l(m);
    back = std::move(r);
  });
  auto want = c.core->WaitPlanWanted(absl::Now() + absl::Seconds(5));
  EXPECT_EQ(want.step, 0u);
  EXPECT_EQ(want.generation, 1u);
  for (uint64_t s = 0; s < 2; ++s) {
    ASSERT_TRUE(c.core->AddPlan(testing::MakePlan(c.data, c.job, s, {2, 3}, 3), want.generation).ok());
  }
  for (int i = 0; i < 2000; ++i) {
    {
      std::lock_guard<std::mutex> l(m);
      if (back.has_value()) break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  {
    std::lock_guard<std::mutex> l(m);
    ASSERT_TRUE(back.has_value());
    ASSERT_TRUE(back->ok()) << back->status();
    EXPECT_EQ((*back)->step(), 0u);
  }
  // Rank 2 holds step 0 now: neither a far step nor a past one moves the
  // window; such a request waits for it (here until its timeout, naming why).
  auto far = c.core->Acquire(30, 3, 100);
  EXPECT_EQ(far.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(far.status().message().find("rank 2 holds step 0"), std::string::npos) << far.status();
  ASSERT_TRUE(c.core->Release(0, 2).ok());
  ASSERT_TRUE(c.core->Acquire(0, 3, 20000).ok());
  ASSERT_TRUE(c.core->Release(0, 3).ok());
  ASSERT_TRUE(c.core->Acquire(1, 3, 20000).ok());  // base is 1 now; rank 3 holds step 1
  far = c.core->Acquire(30, 2, 100);
  EXPECT_EQ(far.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(far.status().message().find("rank 3 holds step 1"), std::string::npos) << far.status();
  // A step before it, a step from what rank 3 holds: the window moves back
  // (plans are asked for from there again) and rank 3 keeps its batch.
  std::optional<absl::StatusOr<v1::BatchDescriptor>> past;
  c.core->AcquireAsync(0, 2, 20000, [&](absl::StatusOr<v1::BatchDescriptor> r) {
    std::lock_guard<std::mutex> l(m);
    past = std::move(r);
  });
  want = c.core->WaitPlanWanted(absl::Now() + absl::Seconds(5));
  EXPECT_EQ(want.step, 0u);
  EXPECT_EQ(want.generation, 2u);
  for (uint64_t s = 0; s < 2; ++s) {
    ASSERT_TRUE(c.core->AddPlan(testing::MakePlan(c.data, c.job, s, {2, 3}, 3), want.generation).ok());
  }
  for (int i = 0; i < 2000; ++i) {
    {
      std::lock_guard<std::mutex> l(m);
      if (past.has_value()) break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  {
    std::lock_guard<std::mutex> l(m);
    ASSERT_TRUE(past.has_value());
    ASSERT_TRUE(past->ok()) << past->status();
    EXPECT_EQ((*past)->step(), 0u);
  }
  EXPECT_TRUE(c.core->Release(1, 3).ok());
}

// The two kill-and-resume scenarios, on one stager that keeps running:
// (1) both ranks die holding step 3 and the job restarts from its checkpoint
// at step 2; (2) later only rank 2 dies holding its step and is restarted on
// its own, a step further. Each new process is a new incarnation; nothing is
// restarted but the ranks.
// Hands the stager the plans it asks for, as the packer client does: from
// the step it wants up to its limit, again from the new step when the window
// moves (a new generation).
class PlanFeeder {
 public:
  explicit PlanFeeder(Core& c) : c_(c), thread_([this] { Run(); }) {}
  ~PlanFeeder() {
    stop_ = true;
    thread_.join();
  }

 private:
  void Run() {
    while (!stop_) {
      const auto want = c_.core->WaitPlanWanted(absl::Now() + absl::Milliseconds(50));
      if (want.stop) return;
      for (uint64_t s = want.step; s < want.end && !stop_; ++s) {
        absl::Status st =
            c_.core->AddPlan(testing::MakePlan(c_.data, c_.job, s, {2, 3}, 3), want.generation);
        if (!st.ok()) break;  // the window moved: ask again
      }
    }
  }
  Core& c_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(StagerCoreTest, RanksKilledAndResumedAreServedAgainOnTheSameStager) {
  Core c("restart", {.shards = 2, .samples_per_shard = 6});
  PlanFeeder feeder(c);
  auto process = [&](uint32_t rank) {  // a new process of the rank registers
    absl::StatusOr<ProcessKey> p = c.core->RegisterRank(rank);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.value_or(ProcessKey{});
  };
  auto take = [&](uint64_t step, uint32_t rank, const ProcessKey& p) {
    auto d = c.core->Acquire(step, rank, 20000, p);
    EXPECT_TRUE(d.ok()) << "step " << step << " rank " << rank << ": " << d.status();
    if (d.ok()) {
      EXPECT_EQ(d->step(), step);
    }
    return d;
  };
  std::map<uint32_t, ProcessKey> first = {{2, process(2)}, {3, process(3)}};
  for (uint64_t step = 0; step < 3; ++step) {
    for (uint32_t r : {2u, 3u}) {
      ASSERT_TRUE(take(step, r, first[r]).ok());
      ASSERT_TRUE(c.core->Release(step, r, first[r]).ok());
    }
  }
  ASSERT_TRUE(take(3, 2, first[2]).ok());  // both die holding step 3
  ASSERT_TRUE(take(3, 3, first[3]).ok());

  // (1) Restarted from the checkpoint at step 2, one rank after the other:
  // rank 2's new process asks for step 2 while rank 3's old one still holds
  // step 3: the window moves back, and rank 3's new process is served too.
  std::mutex m;
  std::map<uint32_t, absl::StatusOr<v1::BatchDescriptor>> got;
  std::map<uint32_t, ProcessKey> second;
  for (uint32_t r : {2u, 3u}) {
    second[r] = process(r);
    c.core->AcquireAsync(
        2, r, 30000,
        [&, r](absl::StatusOr<v1::BatchDescriptor> d) {
          std::lock_guard<std::mutex> l(m);
          got.emplace(r, std::move(d));
        },
        second[r]);
  }
  for (int i = 0; i < 12000; ++i) {
    {
      std::lock_guard<std::mutex> l(m);
      if (got.size() == 2) break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  {
    std::lock_guard<std::mutex> l(m);
    ASSERT_EQ(got.size(), 2u);
    for (auto& [r, d] : got) {
      ASSERT_TRUE(d.ok()) << "rank " << r << ": " << d.status();
      EXPECT_EQ(d->step(), 2u);
    }
  }
  // A replaced process is refused, and cannot release its successor's batch.
  EXPECT_EQ(c.core->Acquire(3, 2, 100, first[2]).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.core->Release(2, 2, first[2]).code(), absl::StatusCode::kFailedPrecondition);
  for (uint32_t r : {2u, 3u}) ASSERT_TRUE(c.core->Release(2, r, second[r]).ok());
  for (uint32_t r : {2u, 3u}) ASSERT_TRUE(take(3, r, second[r]).ok());
  ASSERT_TRUE(c.core->Release(3, 3, second[3]).ok());

  // (2) Rank 2 dies holding step 3 and comes back alone at step 4; both go
  // on past where the window used to stall (base + 2 * window).
  ASSERT_TRUE(take(4, 3, second[3]).ok());
  ASSERT_TRUE(c.core->Release(4, 3, second[3]).ok());
  const ProcessKey third = process(2);
  for (uint64_t step = 4; step < 10; ++step) {
    for (uint32_t r : {2u, 3u}) {
      if (step == 4 && r == 3) continue;  // taken above
      const ProcessKey& p = r == 2 ? third : second[3];
      ASSERT_TRUE(take(step, r, p).ok());
      ASSERT_TRUE(c.core->Release(step, r, p).ok());
    }
  }
}

// The placeholder of a failed image: its rows all zeros (the mean colour).
bool AllZero(const ShmSegment& seg, const v1::BatchDescriptor& d, uint64_t first_row, uint64_t rows) {
  const auto& px = Array(d, "pixel_values");
  const uint64_t row_bytes = px.nbytes() / px.shape(0);
  const char* p = seg.data() + px.offset() + first_row * row_bytes;
  for (uint64_t i = 0; i < rows * row_bytes; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// Overwrites the image bytes of sample `id` in its source shard. As indexed
// (the checksums taken after the damage): the image is corrupt, not changed.
std::function<void(testing::Dataset&)> Corrupt(int id, bool after_indexing = false) {
  return [id, after_indexing](testing::Dataset& d) {
    v1::MemberRef& m = *d.samples[id].mutable_images(0);
    const std::string path = d.dir + "/" + d.shards[d.samples[id].shard()].name();
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(m.offset()));
    const std::string junk(m.size(), 'Z');
    f << junk;
    if (after_indexing) return;  // the index's checksums describe the bytes before
    d.shards[d.samples[id].shard()].set_crc32c(0);
    m.set_crc32c(Crc32c(junk));
  };
}

TEST(StagerCoreTest, AMemberChangedAfterIndexingIsNeverDecodedIntoABatch) {
  // Sample 7's image changed at the source after indexing: staging refuses
  // the shard (its checksum), the member read from the source fails its own
  // checksum, is read once more, and is skipped as "checksum", never decoded.
  Core c("checksum", {.shards = 1, .samples_per_shard = 12}, {}, {}, {}, Corrupt(7, true));
  c.Plans(0, 2);
  int seen = 0;
  for (uint64_t s = 0; s < 2; ++s) {
    for (uint32_t r : {2u, 3u}) {
      auto d = c.core->Acquire(s, r, 20000);
      ASSERT_TRUE(d.ok()) << d.status();
      uint64_t rows = 0, first = 0, own = 0;
      for (const auto& ip : d->plan().encoders(0).images()) {
        if (ip.sample_id() == 7) first = rows, own = ip.patches();
        rows += ip.patches();
      }
      if (own == 0) continue;
      ++seen;
      ASSERT_EQ(d->skipped_size(), 1);
      EXPECT_EQ(d->skipped(0).sample_id(), 7u);
      EXPECT_EQ(d->skipped(0).reason(), "checksum");
      EXPECT_NE(d->skipped(0).detail().find("000007.jpg"), std::string::npos) << d->skipped(0).detail();
      EXPECT_NE(d->skipped(0).detail().find("but the index says"), std::string::npos);
      auto seg = ShmSegment::Open(d->shm_name(), false);
      ASSERT_TRUE(seg.ok());
      EXPECT_TRUE(AllZero(**seg, *d, first, own));  // the placeholder, not the damaged image
    }
  }
  EXPECT_GE(seen, 1);  // once per batch it is planned in, each read again once
  EXPECT_EQ(c.metrics->SkippedSamples("checksum").Value(), seen);
  EXPECT_EQ(c.metrics->checksum_rereads.Value(), seen);
}

TEST(StagerCoreTest, AMemberDamagedInTheCacheIsReadAgainFromTheSource) {
  // The cached copy of a staged shard is damaged (a bad disk): the member
  // fails its checksum there, is read from the source, and is decoded right.
  // The shard is staged and damaged before any plan names it: a batch
  // assembled as soon as its shard is staged would otherwise race the damage.
  Core c("checksum-cache", {.shards = 1, .samples_per_shard = 12});
  c.core->staging()->Request(c.data.shards[0], 0);
  ASSERT_TRUE(c.core->staging()->Wait({c.data.shards[0].name()}, absl::Now() + absl::Seconds(20)).ok());
  const v1::MemberRef& m = c.data.samples[7].images(0);
  {
    std::fstream f(c.core->cache()->PathOf(c.data.shards[0].name()),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(m.offset() + 100));
    f << std::string(64, 'Z');
  }
  c.Plans(0, 1);
  for (uint32_t r : {2u, 3u}) {
    auto d = c.core->Acquire(0, r, 20000);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->skipped_size(), 0) << d->DebugString();
    for (const auto& ip : d->plan().encoders(0).images()) {
      if (ip.sample_id() != 7) continue;
      auto seg = ShmSegment::Open(d->shm_name(), false);
      ASSERT_TRUE(seg.ok());
      const std::string want = c.DecodeDirectly(ip);
      uint64_t rows = 0;
      for (const auto& other : d->plan().encoders(0).images()) {
        if (other.sample_id() == 7) break;
        rows += other.patches();
      }
      const auto& px = Array(*d, "pixel_values");
      const uint64_t row_bytes = px.nbytes() / px.shape(0);
      EXPECT_EQ(std::string((*seg)->data() + px.offset() + rows * row_bytes, want.size()), want);
    }
  }
  EXPECT_EQ(c.metrics->checksum_rereads.Value(), 1);
}

TEST(StagerCoreTest, CorruptImageBecomesAPlaceholderNeverAnotherSamplesImage) {
  Core c("corrupt", {.shards = 1, .samples_per_shard = 12}, {}, {}, {}, Corrupt(7));
  c.Plans(0, 2);
  for (uint64_t s = 0; s < 2; ++s) {
    for (uint32_t r : {2u, 3u}) {
      auto d = c.core->Acquire(s, r, 20000);
      ASSERT_TRUE(d.ok()) << d.status();
      bool names7 = false;
      for (const auto& ip : d->plan().encoders(0).images()) names7 |= ip.sample_id() == 7;
      if (!names7) continue;
      ASSERT_EQ(d->skipped_size(), 1);
      EXPECT_EQ(d->skipped(0).sample_id(), 7u);
      EXPECT_EQ(d->skipped(0).reason(), "corrupt");
      EXPECT_NE(d->skipped(0).detail().find("000007.jpg"), std::string::npos) << d->skipped(0).detail();
      EXPECT_EQ(d->skipped(0).action(), "placeholder");
      EXPECT_EQ(d->skipped(0).substitute_id(), 0u);
      // Shapes stay as planned; sample 7's rows hold the placeholder, not
      // another sample's pixels (its caption would be trained against them).
      uint64_t rows = 0, first = 0, own = 0;
      for (const auto& ip : d->plan().encoders(0).images()) {
        if (ip.sample_id() == 7) first = rows, own = ip.patches();
        rows += ip.patches();
      }
      EXPECT_EQ(Array(*d, "pixel_values").shape(0), rows);
      auto seg = ShmSegment::Open(d->shm_name(), false);
      ASSERT_TRUE(seg.ok());
      EXPECT_TRUE(AllZero(**seg, *d, first, own));
    }
  }
}

TEST(StagerCoreTest, SkippedMembersAreLoggedNamingShardAndMember) {
  ::testing::internal::CaptureStderr();
  {
    Core c("skiplog", {.shards = 1, .samples_per_shard = 12}, {}, {}, {}, Corrupt(7));
    c.Plans(0, 2);
    for (uint64_t s = 0; s < 2; ++s) {
      for (uint32_t r : {2u, 3u}) ASSERT_TRUE(c.core->Acquire(s, r, 20000).ok());
    }
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  const size_t at = log.find("skipped a sample member");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string line = log.substr(at, log.find('\n', at) - at);
  EXPECT_NE(line.find("reason=corrupt"), std::string::npos) << line;
  EXPECT_NE(line.find("shard=train/shard-00000.tar"), std::string::npos) << line;
  EXPECT_NE(line.find("member=000007.jpg"), std::string::npos) << line;
  EXPECT_NE(line.find("sample=7"), std::string::npos) << line;
}

TEST(StagerCoreTest, WindowOccupancyIsPerLocalRankAndCountsBatchesReadyAhead) {
  Core c("occupancy", {.shards = 2, .samples_per_shard = 6});
  c.Plans(0, 2);
  // Rank 2 takes step 0; its step 1 and rank 3's steps 0 and 1 stay ahead.
  ASSERT_TRUE(c.core->Acquire(0, 2, 20000).ok());
  ASSERT_TRUE(c.core->Acquire(1, 3, 20000).ok());  // gives up rank 3's step 0, takes step 1
  auto ahead = [&](uint32_t rank) { return c.metrics->WindowBatches(rank).Value(); };
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while ((ahead(2) != 1 || ahead(3) != 0) && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(ahead(2), 1);  // step 1, built, not taken yet
  EXPECT_EQ(ahead(3), 0);
  // The wait a rank reports with its release is what tutti_stager_client_wait_seconds shows.
  ASSERT_TRUE(c.core->Release(0, 2, /*caller=*/{}, 0.25).ok());
  ASSERT_TRUE(c.core->Release(1, 3).ok());  // an older client: nothing reported
  prometheus::ClientMetric m = c.metrics->client_wait_seconds.Collect();
  EXPECT_EQ(m.histogram.sample_count, 1u);
  EXPECT_DOUBLE_EQ(m.histogram.sample_sum, 0.25);
  EXPECT_EQ(c.metrics->acquire_wait_seconds.Collect().histogram.sample_count, 2u);
}

TEST(StagerCoreTest, ReleaseRefusesAWaitThatIsNotAFiniteNonNegativeTime) {
  Core c("badwait", {.shards = 2, .samples_per_shard = 6});
  c.Plans(0, 2);
  ASSERT_TRUE(c.core->Acquire(0, 2, 20000).ok());
  for (const double bad : {std::nan(""), std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(), -0.5, 2e6}) {
    const absl::Status s = c.core->Release(0, 2, /*caller=*/{}, bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad << ": " << s;
    EXPECT_NE(s.message().find("wait_seconds"), std::string::npos) << s;
  }
  // Refused before anything moved: the batch is still held and released now.
  EXPECT_EQ(c.metrics->client_wait_seconds.Collect().histogram.sample_count, 0u);
  ASSERT_TRUE(c.core->Release(0, 2, /*caller=*/{}, 0.0).ok());
  ASSERT_TRUE(c.core->Acquire(1, 2, 20000).ok());
  ASSERT_TRUE(c.core->Release(1, 2, /*caller=*/{}, kMaxWaitSeconds).ok());
  prometheus::ClientMetric m = c.metrics->client_wait_seconds.Collect();
  EXPECT_EQ(m.histogram.sample_count, 2u);
  EXPECT_DOUBLE_EQ(m.histogram.sample_sum, kMaxWaitSeconds);
}

// The job's bounds on images, refused by the stager (a safety net: the
// packer plans none of these) at the limit and one past it, each skipped as
// "too_large" naming the bound and counted in LimitRefusals.
std::string OnlySkip(const v1::BatchDescriptor& d) {
  EXPECT_EQ(d.skipped_size(), 1) << d.DebugString();
  if (d.skipped_size() != 1) return "";
  EXPECT_EQ(d.skipped(0).reason(), "too_large");
  EXPECT_EQ(d.skipped(0).action(), "placeholder");
  return d.skipped(0).detail();
}

TEST(StagerCoreTest, ImagesPerSampleOverTheLimitAreRefusedAndCounted) {
  Core c("maximages", {.shards = 1, .samples_per_shard = 12}, {}, {}, {}, nullptr,
         [](v1::JobConfig& config) { config.mutable_vision()->set_max_images_per_sample(1); });
  // Step 0: one image per sample, at the limit. Step 1: rank 2's first
  // sample lists a second image (only its first is planned here).
  c.Plans(0, 2, 3, [](v1::StepPlan& plan) {
    if (plan.step() != 1) return;
    const uint64_t id = plan.ranks(0).encoders(0).images(0).sample_id();
    for (auto& s : *plan.mutable_samples()) {
      if (s.sample_id() == id) *s.add_images() = s.images(0);
    }
  });
  auto at = c.core->Acquire(0, 2, 20000);
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(at->skipped_size(), 0);
  auto over = c.core->Acquire(1, 2, 20000);
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_NE(OnlySkip(*over).find("has 2 images, over the limit (vision.max_images_per_sample 1)"),
            std::string::npos)
      << OnlySkip(*over);
  EXPECT_EQ(c.metrics->LimitRefusals("images_per_sample").Value(), 1);
  EXPECT_EQ(c.metrics->LimitRefusals("image_pixels").Value(), 0);
}

TEST(StagerCoreTest, PlannedPixelsOverTheStepsMaxPixelsAreRefusedAndCounted) {
  Core c("maxpixels", {.shards = 1, .samples_per_shard = 12});
  // Every image of these plans is planned at the same size; step 0 allows
  // exactly its area, step 1 one pixel less.
  c.Plans(0, 2, 3, [](v1::StepPlan& plan) {
    const auto& ip = plan.ranks(0).encoders(0).images(0);
    const uint64_t area = uint64_t{ip.resized_height()} * ip.resized_width();
    plan.set_max_pixels(plan.step() == 0 ? area : area - 1);
  });
  auto at = c.core->Acquire(0, 2, 20000);
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(at->skipped_size(), 0);
  auto over = c.core->Acquire(1, 2, 20000);
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_EQ(over->skipped_size(), 3);
  for (const auto& s : over->skipped()) {
    EXPECT_EQ(s.reason(), "too_large");
    EXPECT_NE(s.detail().find("over the limit (the step's max_pixels"), std::string::npos)
        << s.detail();
  }
  ASSERT_TRUE(c.core->Acquire(0, 3, 20000).ok());
  auto over3 = c.core->Acquire(1, 3, 20000);  // rank 3's step 1 too
  ASSERT_TRUE(over3.ok()) << over3.status();
  EXPECT_EQ(over3->skipped_size(), 3);
  EXPECT_EQ(c.metrics->LimitRefusals("image_pixels").Value(), 6);
}

TEST(StagerCoreTest, SourcePixelsOverTheLimitAreRefusedAndCounted) {
  for (const uint64_t limit : {uint64_t{200 * 150}, uint64_t{200 * 150 - 1}}) {
    Core c(absl::StrCat("maxsource", limit), {.shards = 1, .samples_per_shard = 12}, {}, {}, {},
           nullptr,
           [&](v1::JobConfig& config) { config.mutable_vision()->set_max_source_pixels(limit); });
    c.Plans(0, 1);
    auto d = c.core->Acquire(0, 2, 20000);
    ASSERT_TRUE(d.ok()) << d.status();
    auto d3 = c.core->Acquire(0, 3, 20000);
    ASSERT_TRUE(d3.ok()) << d3.status();
    const bool over = limit < 200 * 150;
    EXPECT_EQ(d->skipped_size(), over ? 3 : 0) << limit;
    EXPECT_EQ(d3->skipped_size(), over ? 3 : 0) << limit;
    EXPECT_EQ(c.metrics->LimitRefusals("source_pixels").Value(), over ? 6 : 0) << limit;
    if (over) {
      EXPECT_NE(d->skipped(0).detail().find("vision.max_source_pixels 29999"), std::string::npos)
          << d->skipped(0).detail();
    }
  }
}

// Image tokens in input_ids, and what the kept images need.
void ExpectConsistent(const v1::BatchDescriptor& d, const ShmSegment& seg) {
  const auto& grid = Array(d, "image_grid_thw");
  const int32_t* g = reinterpret_cast<const int32_t*>(seg.data() + grid.offset());
  uint64_t patches = 0;
  for (uint64_t i = 0; i < grid.shape(0); ++i) patches += uint64_t(g[3 * i]) * g[3 * i + 1] * g[3 * i + 2];
  EXPECT_EQ(Array(d, "pixel_values").shape(0), patches);
  const auto& ids = Array(d, "input_ids");
  const int32_t* t = reinterpret_cast<const int32_t*>(seg.data() + ids.offset());
  uint64_t pads = 0;
  for (uint64_t i = 0; i < ids.shape(0); ++i) pads += t[i] == 151655;
  EXPECT_EQ(pads, patches / 4);  // merge 2x2
  const auto& cu = Array(d, "cu_seqlens");
  const int32_t* c = reinterpret_cast<const int32_t*>(seg.data() + cu.offset());
  EXPECT_EQ(cu.shape(0), Array(d, "doc_sample_ids").shape(0) + 1);
  EXPECT_EQ(static_cast<uint64_t>(c[cu.shape(0) - 1]), ids.shape(0));
}

TEST(StagerCoreTest, DropPolicyRemovesTheWholeSampleConsistently) {
  StagerOptions o;
  o.skip_policy = "drop";
  Core c("drop", {.shards = 1, .samples_per_shard = 12}, o, {}, {}, Corrupt(6));
  c.Plans(0, 1);
  auto d = c.core->Acquire(0, 2, 20000);  // rank 2 of step 0 holds samples 6, 7, 8
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->skipped_size(), 1);
  EXPECT_EQ(d->skipped(0).sample_id(), 6u);
  EXPECT_EQ(d->skipped(0).substitute_id(), 0u);
  EXPECT_EQ(d->skipped(0).action(), "dropped");
  EXPECT_NE(d->skipped(0).detail().find("sample dropped"), std::string::npos) << d->skipped(0).detail();
  // Its image and its document are gone; the arrays agree with each other.
  auto seg = ShmSegment::Open(d->shm_name(), false);
  ASSERT_TRUE(seg.ok());
  EXPECT_EQ(Array(*d, "image_grid_thw").shape(0), 2u);
  const auto& doc_ids = Array(*d, "doc_sample_ids");
  ASSERT_EQ(doc_ids.shape(0), 2u);
  const int64_t* di = reinterpret_cast<const int64_t*>((*seg)->data() + doc_ids.offset());
  EXPECT_EQ(di[0], 7);
  EXPECT_EQ(di[1], 8);
  ExpectConsistent(*d, **seg);
  EXPECT_EQ(c.metrics->dropped_samples.Value(), 1);
}

TEST(StagerCoreTest, DropPolicyKeepsASampleThatCrossesRanks) {
  // Sample 6's image is encoded on rank 2 but its LLM phase is rank 3's:
  // removing it would break the exchange sizes, so it is kept at its planned
  // shape as a placeholder even under drop, and reported.
  StagerOptions o;
  o.skip_policy = "drop";
  Core c("drop_cross", {.shards = 1, .samples_per_shard = 12}, o, {}, {}, Corrupt(6));
  c.Plans(0, 1, 3, [](v1::StepPlan& plan) {
    plan.mutable_ranks(0)->mutable_encoders(0)->mutable_images(0)->set_llm_rank(3);
  });
  auto d = c.core->Acquire(0, 2, 20000);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->skipped_size(), 1);
  EXPECT_EQ(d->skipped(0).sample_id(), 6u);
  EXPECT_EQ(Array(*d, "image_grid_thw").shape(0), 3u);
  EXPECT_EQ(Array(*d, "doc_sample_ids").shape(0), 3u);
  EXPECT_EQ(c.metrics->dropped_samples.Value(), 0);
  EXPECT_EQ(d->skipped(0).action(), "placeholder");
  EXPECT_EQ(c.metrics->placeholder_samples.Value(), 1);
}

TEST(StagerCoreTest, RemoteLoadImagesAreReadFromTheSource) {
  // Rank 3 encodes samples 6 and 7 (shard 1) for rank 2's LLM phase, and the
  // plan says shard 1 is staged on another node: the images are read from the
  // source directly (real pixels, counted) and shard 1 is not staged here.
  Core c("remote", {.shards = 2, .samples_per_shard = 6});
  c.Plans(0, 1, 2, [](v1::StepPlan& plan) {
    v1::RankPlan* r3 = plan.mutable_ranks(1);
    ASSERT_EQ(r3->rank(), 3u);
    r3->clear_micro_batches();
    for (auto& ip : *r3->mutable_encoders(0)->mutable_images()) {
      ip.set_remote_load(true);
      ip.set_llm_rank(2);
    }
  });
  auto d = c.core->Acquire(0, 3, 20000);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->skipped_size(), 0);
  auto seg = ShmSegment::Open(d->shm_name(), false);
  ASSERT_TRUE(seg.ok());
  const auto& ip = d->plan().encoders(0).images(0);
  const std::string direct = c.DecodeDirectly(ip);
  ASSERT_FALSE(direct.empty());
  EXPECT_EQ(0, std::memcmp((*seg)->data() + Array(*d, "pixel_values").offset(), direct.data(),
                           direct.size()));
  EXPECT_EQ(c.metrics->remote_load_images.Value(), 2);
  EXPECT_GT(c.metrics->read_source_seconds.Collect().histogram.sample_count, 0u);
  EXPECT_EQ(c.core->staging()->Status(c.data.shards[1].name()).state, ShardState::kUnknown);
  EXPECT_EQ(c.core->staging()->Status(c.data.shards[0].name()).state, ShardState::kStaged);
}

TEST(StagerCoreTest, AudioIsDecodedToFloat32AtTheConfiguredRate) {
  // 250 ms clips of PCM16 at 8 kHz; the job wants 16 kHz mono float32.
  Core c("audio", {.shards = 1, .samples_per_shard = 8, .audio_ms = 250, .audio_rate = 8000});
  c.Plans(0, 1, 2);
  auto d = c.core->Acquire(0, 2, 20000);  // samples 4, 5
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->skipped_size(), 0);
  auto seg = ShmSegment::Open(d->shm_name(), false);
  ASSERT_TRUE(seg.ok());
  const uint32_t rate = c.job.config().audio().sample_rate();
  ASSERT_EQ(rate, 16000u);
  const uint64_t per_clip = 250 * rate / 1000;
  const auto& values = Array(*d, "audio_values");
  EXPECT_EQ(values.dtype(), v1::DTYPE_FLOAT32);
  ASSERT_EQ(values.shape(0), 2 * per_clip);
  const auto& lengths = Array(*d, "audio_lengths");
  const int32_t* len = reinterpret_cast<const int32_t*>((*seg)->data() + lengths.offset());
  EXPECT_EQ(len[0], static_cast<int32_t>(per_clip));
  EXPECT_EQ(len[1], static_cast<int32_t>(per_clip));
  // Sample i of the output sits at i/2 of the 8 kHz source: even samples
  // are source samples, odd ones the mean of their neighbours.
  const float* v = reinterpret_cast<const float*>((*seg)->data() + values.offset());
  for (uint64_t i : {0ul, 1ul, 2ul, 101ul, 2000ul, 3997ul}) {
    const float a = testing::TestPcm(i / 2, 8000) / 32768.0f;
    const float b = testing::TestPcm(i / 2 + 1, 8000) / 32768.0f;
    const float want = i % 2 == 0 ? a : (a + b) / 2;
    EXPECT_NEAR(v[i], want, 1e-5) << i;
    EXPECT_NEAR(v[per_clip + i], want, 1e-5) << i;  // both clips hold the same sine
  }
  // The document carries audio markers around its audio tokens.
  const auto& ids = Array(*d, "input_ids");
  const int32_t* t = reinterpret_cast<const int32_t*>((*seg)->data() + ids.offset());
  int starts = 0, pads = 0;
  for (uint64_t i = 0; i < ids.shape(0); ++i) {
    starts += t[i] == static_cast<int32_t>(c.job.config().audio().audio_start_id());
    pads += t[i] == static_cast<int32_t>(c.job.config().audio().audio_pad_id());
  }
  EXPECT_EQ(starts, 2);
  EXPECT_EQ(pads, 2 * 7);  // 25 frames of 10 ms, 4 per token -> 7 tokens a clip
}

TEST(StagerCoreTest, TruncatedShardIsReadAroundAndReported) {
  auto truncate = [](testing::Dataset& d) {
    const std::string path = d.dir + "/" + d.shards[0].name();
    fs::resize_file(path, d.shards[0].size() / 2);
  };
  StagerOptions o;
  o.stage_wait_ms = 200;
  Core c("trunc", {.shards = 1, .samples_per_shard = 12}, o, {}, {}, truncate);
  c.Plans(0, 1);
  auto d = c.core->Acquire(0, 3, 20000);  // samples 9..11: in the lost half
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_GT(d->skipped_size(), 0);
  EXPECT_NE(d->skipped(0).detail().find("truncated"), std::string::npos) << d->skipped(0).detail();
  EXPECT_EQ(d->skipped(0).reason(), "truncated");
  auto st = c.core->staging()->Status(c.data.shards[0].name());
  EXPECT_EQ(st.state, ShardState::kFailed);
  EXPECT_NE(st.error.message().find("index says"), std::string::npos) << st.error;
}

TEST(StagerCoreTest, CutOffImagesAreCountedTruncatedNamingTheFile) {
  // Sample 4's PNG is cut short inside an intact shard (its tail zeroed, the
  // IEND chunk gone) and indexed so; the member is skipped as "truncated", named.
  auto cut = [](testing::Dataset& d) {
    v1::MemberRef& m = *d.samples[4].mutable_images(0);
    const std::string path = d.dir + "/" + d.shards[0].name();
    {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(m.offset() + m.size() / 2));
      f << std::string(m.size() - m.size() / 2, '\0');
    }
    d.shards[0].set_crc32c(0);
    auto bytes = ReadFileToString(path);
    ASSERT_TRUE(bytes.ok());
    m.set_crc32c(Crc32c(absl::string_view(*bytes).substr(m.offset(), m.size())));
  };
  Core c("cut", {.shards = 1, .samples_per_shard = 8, .ext = ".png"}, {}, {}, {}, cut);
  c.Plans(0, 1, 2);
  auto d = c.core->Acquire(0, 2, 20000);  // samples 4, 5
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->skipped_size(), 1);
  EXPECT_EQ(d->skipped(0).sample_id(), 4u);
  EXPECT_EQ(d->skipped(0).reason(), "truncated");
  EXPECT_NE(d->skipped(0).detail().find("train/shard-00000.tar:000004.png: truncated PNG"),
            std::string::npos)
      << d->skipped(0).detail();
  EXPECT_EQ(c.metrics->SkippedSamples("truncated").Value(), 1);
}

TEST(StagerCoreTest, StalledReadsMissTheDeadlineButTheBatchShips) {
  IoFault stall_stage;
  stall_stage.path_contains = "shard-00001";
  stall_stage.stall = true;
  IoFault stall_read = stall_stage;
  StagerOptions o;
  o.sample_deadline_ms = 300;
  o.stage_wait_ms = 100;
  Core c("stall", {.shards = 2, .samples_per_shard = 6}, o, {stall_stage}, {stall_read});
  c.Plans(0, 1);
  const absl::Time t0 = absl::Now();
  auto d = c.core->Acquire(0, 3, 20000);  // samples 9..11 live in shard 1
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  ASSERT_EQ(d->skipped_size(), 6);  // three images and three texts
  for (const auto& s : d->skipped()) {
    EXPECT_EQ(s.reason(), "deadline");
    // Names the shard and the member, and what ran out.
    EXPECT_NE(s.detail().find("shard train/shard-00001.tar member 0000"), std::string::npos)
        << s.detail();
    EXPECT_NE(s.detail().find("waiting for I/O"), std::string::npos) << s.detail();
  }
  auto ok = c.core->Acquire(0, 2, 20000);  // samples 6..8: shard 1 as well
  ASSERT_TRUE(ok.ok());
}

// Reads that miss their deadline because the stager's own I/O thread was
// held up (as on a host short of CPU) are not blamed on the file system:
// the skip says they were never sent, and that the thread ran late.
TEST(StagerCoreTest, ReadsLateForWantOfCpuSaySoAndNameShardAndMember) {
  IoFault stall_stage;
  stall_stage.path_contains = "shard-00000";
  stall_stage.stall = true;
  IoFault hold;  // holds the source-read thread, as a starved CPU would
  hold.path_contains = "shard-00000";
  hold.kind = IoOp::Kind::kOpen;
  hold.before = [] { absl::SleepFor(absl::Milliseconds(900)); };
  StagerOptions o;
  o.sample_deadline_ms = 300;
  o.stage_wait_ms = 50;
  Core c("starved", {.shards = 1, .samples_per_shard = 6}, o, {stall_stage}, {hold});
  c.Plans(0, 1);
  auto d = c.core->Acquire(0, 2, 20000);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_GT(d->skipped_size(), 0);
  for (const auto& s : d->skipped()) {
    EXPECT_EQ(s.reason(), "deadline");
    EXPECT_NE(s.detail().find("shard train/shard-00000.tar member "), std::string::npos)
        << s.detail();
    EXPECT_NE(s.detail().find("was never sent to the file system"), std::string::npos)
        << s.detail();
    EXPECT_NE(s.detail().find("short of CPU"), std::string::npos) << s.detail();
    EXPECT_EQ(s.detail().find("did not answer"), std::string::npos) << s.detail();
    EXPECT_EQ(s.detail().find("stalls"), std::string::npos) << s.detail();
  }
}

TEST(StagerCoreTest, BadSetupIsAClearError) {
  StagerOptions o;
  o.cache_dir = Fresh("setup") + "/cache";
  o.staging.source_dir = "/nonexistent/dataset";
  StagerCore core(o, nullptr);
  auto data = testing::WriteDataset(Fresh("setup_ds"), {.shards = 1, .samples_per_shard = 1});
  absl::Status s = core.Start(testing::MakeJob(data, 2, 2));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("/nonexistent/dataset"), std::string::npos);
  StagerOptions o2 = o;
  o2.node = 5;
  StagerCore core2(o2, nullptr);
  absl::Status s2 = core2.Start(testing::MakeJob(data, 2, 2));
  EXPECT_EQ(s2.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s2.message().find("--node 5"), std::string::npos);
}

TEST(StagerCoreTest, StageStatusBeforeStartIsEmpty) {
  // A client may ask while the daemon still waits for its job from the
  // packer: there is no cache or staging yet, and nothing to dereference.
  StagerOptions o;
  o.cache_dir = Fresh("unstarted") + "/cache";
  StagerCore core(o, nullptr);
  EXPECT_FALSE(core.Started());
  const v1::StageStatus st = core.GetStageStatus();
  EXPECT_EQ(st.shards_size(), 0);
  EXPECT_EQ(st.cache_capacity_bytes(), 0u);
}

}  // namespace
}  // namespace tutti::stager
