// IoService and its backends with a file that stops answering: the file
// holds at most its bound of the backend, other files carry on, timeouts are
// told apart from waits in the service's own queue, and stopping does not
// wait on what is stuck.
//
// Tests named StalledFile* leave an operation stuck for good on purpose:
// IoService then keeps its memory and the backend alive (LeakSanitizer sees
// that at exit, so the sanitizer run in .ci/run leaves them out).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/file_io.h"
#include "common/pread_backend.h"
#include "common/uring_file.h"
#include "gtest/gtest.h"

namespace tutti {
namespace {

std::string Dir() {
  static const std::string dir = [] {
    std::string d = ::testing::TempDir() + "io_stall_test_" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

std::unique_ptr<IoBackend> Backend(bool uring, unsigned depth) {
  if (!uring) return MakePreadBackend(depth);
  auto b = MakeUringBackend(depth, 2 * depth);
  EXPECT_TRUE(b.ok()) << b.status();
  return std::move(*b);
}

// Results of operations submitted without waiting, by index.
class Results {
 public:
  IoService::Done At(size_t i) {
    return [this, i](int64_t r) {
      absl::MutexLock l(&mu_);
      if (results_.size() <= i) results_.resize(i + 1, kPending);
      results_[i] = r;
    };
  }
  // Waits until n results are in (or 10 s).
  std::vector<int64_t> Await(size_t n) {
    absl::MutexLock l(&mu_);
    want_ = n;
    mu_.AwaitWithTimeout(absl::Condition(this, &Results::Enough), absl::Seconds(10));
    return results_;
  }
  static constexpr int64_t kPending = INT64_MIN;

 private:
  bool Enough() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    size_t k = 0;
    for (int64_t r : results_) k += r != kPending;
    return k >= want_;
  }
  absl::Mutex mu_;
  std::vector<int64_t> results_ ABSL_GUARDED_BY(mu_);
  size_t want_ ABSL_GUARDED_BY(mu_) = 0;
};

int OpenFile(IoService& io, const std::string& path) {
  IoOp open;
  open.kind = IoOp::Kind::kOpen;
  open.path = path.c_str();
  open.flags = O_RDONLY;
  return static_cast<int>(io.Run(open, absl::Now() + absl::Seconds(10)));
}

IoOp ReadOf(int fd, char* buf, size_t len, uint64_t file) {
  IoOp r;
  r.kind = IoOp::Kind::kRead;
  r.fd = fd;
  r.buf = buf;
  r.len = len;
  r.file = file;
  r.may_stall = true;
  return r;
}

class StalledFileTest : public ::testing::TestWithParam<bool> {};

// A file whose reads never return (and cannot be cancelled: a hard NFS
// mount, a FUSE read sent in the background) beside a healthy one, on a
// backend of 4: the stalled file holds at most 2 of it; its reads past that
// wait for their deadline in the queue (kTimedOutQueued, not blamed on the
// file system), then, with both slots stuck, are refused at once; the
// healthy file's reads all complete, with the stuck ones no longer counted
// against the backend; stopping does not wait for them.
TEST_P(StalledFileTest, HoldsItsBoundOnlyAndOthersCarryOn) {
  const std::string stalled = Dir() + "/stalled.bin", healthy = Dir() + "/healthy.bin";
  ASSERT_TRUE(WriteFileAtomically(stalled, std::string(65536, 's')).ok());
  ASSERT_TRUE(WriteFileAtomically(healthy, std::string(65536, 'h')).ok());
  IoFault stall;
  stall.path_contains = "stalled.bin";
  stall.stall = true;
  stall.uncancellable = true;
  IoServiceOptions opts;
  opts.per_file_limit = 2;
  auto io = std::make_unique<IoService>(
      std::make_unique<FaultInjectingBackend>(Backend(GetParam(), 4), std::vector<IoFault>{stall}),
      opts);
  const int sfd = OpenFile(*io, stalled), hfd = OpenFile(*io, healthy);
  ASSERT_GE(sfd, 0);
  ASSERT_GE(hfd, 0);
  const uint64_t skey = FileKey("stalled.bin"), hkey = FileKey("healthy.bin");
  // Buffers of reads that never end stay alive for good (as IoService's
  // keepalive would keep them).
  static std::vector<std::string>* sbufs = new std::vector<std::string>(8, std::string(4096, '\0'));
  Results sres, hres;
  const absl::Time t0 = absl::Now();
  for (size_t i = 0; i < 6; ++i) {
    io->Submit(ReadOf(sfd, (*sbufs)[i].data(), 4096, skey), t0 + absl::Milliseconds(400),
               sres.At(i));
  }
  std::vector<std::string> hbufs(20, std::string(4096, '\0'));
  for (size_t i = 0; i < hbufs.size(); ++i) {
    io->Submit(ReadOf(hfd, hbufs[i].data(), 4096, hkey), t0 + absl::Seconds(10), hres.At(i));
  }
  std::vector<int64_t> h = hres.Await(hbufs.size());
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(400)) << "the healthy reads waited on the stall";
  for (int64_t r : h) EXPECT_EQ(r, 4096);
  EXPECT_EQ(hbufs[7], std::string(4096, 'h'));

  std::vector<int64_t> s = sres.Await(6);
  int timed_out = 0, queued = 0;
  for (int64_t r : s) {
    timed_out += r == -ETIMEDOUT;
    queued += r == kTimedOutQueued;
  }
  EXPECT_EQ(timed_out, 2) << "the file's bound: two in the backend";
  EXPECT_EQ(queued, 4) << "the others waited in the queue, never sent";
  IoServiceStats st = io->stats();
  EXPECT_EQ(st.timeouts, 2u);
  EXPECT_EQ(st.queued_timeouts, 4u);
  EXPECT_EQ(st.stuck, 2u);

  // Both slots stuck: the next read of the file is refused at once.
  const absl::Time t1 = absl::Now();
  EXPECT_EQ(io->Run(ReadOf(sfd, (*sbufs)[6].data(), 4096, skey), t1 + absl::Seconds(10)),
            kFileStalled);
  EXPECT_LT(absl::Now() - t1, absl::Seconds(1));
  EXPECT_EQ(io->stats().stalled_refusals, 1u);

  // The whole backend (4) is there for the healthy file.
  Results more;
  for (size_t i = 0; i < 8; ++i) {
    io->Submit(ReadOf(hfd, hbufs[i].data(), 4096, hkey), absl::Now() + absl::Seconds(10),
               more.At(i));
  }
  for (int64_t r : more.Await(8)) EXPECT_EQ(r, 4096);

  const absl::Time stop = absl::Now();
  io.reset();
  EXPECT_LT(absl::Now() - stop, absl::Milliseconds(400)) << "stopping waited for stuck reads";
  ::close(hfd);
}

INSTANTIATE_TEST_SUITE_P(Backends, StalledFileTest, ::testing::Bool(),
                         [](const auto& i) { return i.param ? "io_uring" : "pread"; });

// A file whose reads are ended by their cancel but never answered (a FUSE
// read interrupted at its deadline, as the pread pool does): none stays
// stuck, yet after `per_file_limit` of them in a row its reads are refused
// at once for stalled_file_retry, then sent again; an answer ends that.
TEST(IoServiceTimeoutTest, AFileThatKeepsTimingOutIsRefusedForAWhileThenTriedAgain) {
  const std::string path = Dir() + "/flaky.bin";
  ASSERT_TRUE(WriteFileAtomically(path, std::string(8192, 'f')).ok());
  IoFault stall;  // cancellable: ends with -ECANCELED at the deadline
  stall.path_contains = "flaky.bin";
  stall.stall = true;
  stall.min_offset = 4096;  // the first page answers
  IoServiceOptions opts;
  opts.per_file_limit = 2;
  opts.stalled_file_retry = absl::Seconds(1);
  IoService io(
      std::make_unique<FaultInjectingBackend>(Backend(true, 8), std::vector<IoFault>{stall}), opts);
  const int fd = OpenFile(io, path);
  ASSERT_GE(fd, 0);
  const uint64_t key = FileKey("flaky.bin");
  std::string buf(4096, '\0');
  auto read_at = [&](uint64_t offset) {
    IoOp r = ReadOf(fd, buf.data(), buf.size(), key);
    r.offset = offset;
    return io.Run(r, absl::Now() + absl::Milliseconds(100));
  };
  EXPECT_EQ(read_at(4096), -ETIMEDOUT);
  EXPECT_EQ(read_at(4096), -ETIMEDOUT);
  for (int i = 0; i < 100 && io.stats().stuck > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(io.stats().stuck, 0u) << "the cancels ended them";
  EXPECT_EQ(read_at(0), kFileStalled) << "refused at once, even a read that would answer";
  absl::SleepFor(absl::Milliseconds(1100));
  EXPECT_EQ(read_at(4096), -ETIMEDOUT) << "tried again after stalled_file_retry";
  EXPECT_EQ(read_at(0), kFileStalled) << "one more timeout refuses it again";
  absl::SleepFor(absl::Milliseconds(1100));
  EXPECT_EQ(read_at(0), 4096) << "tried again, answered";
  EXPECT_EQ(read_at(4096), -ETIMEDOUT) << "an answer ended the refusals";
  EXPECT_EQ(io.stats().stalled_refusals, 2u);
  ::close(fd);
}

// The service thread held up (as a host short of CPU holds it up) while an
// operation's deadline passes: it is answered kTimedOutQueued, never sent,
// with the lateness measured, not -ETIMEDOUT as if the file system had
// failed to answer.
TEST(IoServiceTimeoutTest, ATooLateSendIsNotBlamedOnTheFileSystem) {
  const std::string slow = Dir() + "/hold.bin", other = Dir() + "/other.bin";
  ASSERT_TRUE(WriteFileAtomically(slow, std::string(4096, 'a')).ok());
  ASSERT_TRUE(WriteFileAtomically(other, std::string(4096, 'b')).ok());
  IoFault hold;
  hold.path_contains = "hold.bin";
  hold.kind = IoOp::Kind::kOpen;
  hold.before = [] { absl::SleepFor(absl::Milliseconds(300)); };  // on the service thread
  IoService io(
      std::make_unique<FaultInjectingBackend>(Backend(true, 8), std::vector<IoFault>{hold}));
  const int ofd = OpenFile(io, other);
  ASSERT_GE(ofd, 0);
  IoOp open;
  open.kind = IoOp::Kind::kOpen;
  open.path = slow.c_str();
  open.flags = O_RDONLY;
  Results held;
  io.Submit(open, absl::Now() + absl::Seconds(10), held.At(0));
  absl::SleepFor(absl::Milliseconds(50));  // the thread is in the hook now
  std::string buf(4096, '\0');
  IoService::Timeout seen;
  int64_t result = 0;
  absl::Notification done;
  io.Submit(ReadOf(ofd, buf.data(), buf.size(), 0), absl::Now() + absl::Milliseconds(50),
            [&](int64_t r) {
              result = r;
              seen = io.last_timeout();
              done.Notify();
            });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(result, kTimedOutQueued);
  EXPECT_EQ(seen.in_backend, absl::ZeroDuration());
  EXPECT_GE(seen.lag, absl::Milliseconds(100));
  EXPECT_EQ(io.stats().timeouts, 0u);
  const int64_t fd = held.Await(1)[0];
  if (fd >= 0) ::close(static_cast<int>(fd));
  ::close(ofd);
}

// The pread pool interrupts a worker whose operation is cancelled while it
// runs (a FIFO's open blocks until a writer comes, as a stalled file's read
// blocks) and starts another in its place.
TEST(PreadBackendTest, ACancelledCallIsInterruptedAndItsWorkerReplaced) {
  const std::string fifo = Dir() + "/fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  io_internal::PreadBackend pool(1);
  IoOp open;
  open.kind = IoOp::Kind::kOpen;
  open.path = fifo.c_str();
  open.flags = O_RDONLY;  // blocks: no writer
  ASSERT_TRUE(pool.Submit(open, 7).ok());
  absl::SleepFor(absl::Milliseconds(100));
  std::vector<IoCompletion> got;
  ASSERT_TRUE(pool.Reap(absl::ZeroDuration(), &got).ok());
  ASSERT_TRUE(got.empty()) << "the open did not block";
  pool.Cancel(7);
  EXPECT_EQ(pool.replacements(), 1u);
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (got.empty() && absl::Now() < give_up) {
    ASSERT_TRUE(pool.Reap(absl::Milliseconds(100), &got).ok());
  }
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].tag, 7u);
  EXPECT_EQ(got[0].result, -EINTR);
  // And the pool still works.
  const std::string file = Dir() + "/after.bin";
  ASSERT_TRUE(WriteFileAtomically(file, "x").ok());
  open.path = file.c_str();
  ASSERT_TRUE(pool.Submit(open, 8).ok());
  got.clear();
  while (got.empty() && absl::Now() < give_up) {
    ASSERT_TRUE(pool.Reap(absl::Milliseconds(100), &got).ok());
  }
  ASSERT_EQ(got.size(), 1u);
  EXPECT_GE(got[0].result, 0);
  if (got[0].result >= 0) ::close(static_cast<int>(got[0].result));
}

}  // namespace
}  // namespace tutti
