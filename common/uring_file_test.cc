#include "common/uring_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <tuple>

#include "common/file_io.h"
#include "gtest/gtest.h"

namespace tutti {
namespace {

std::string TempDir() {
  std::string dir = ::testing::TempDir() + "uring_file_test_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  return dir;
}

// This process's directory goes when its tests end.
class RemoveTempDir : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(TempDir(), ec);
  }
};
::testing::Environment* const kRemoveTempDir =
    ::testing::AddGlobalTestEnvironment(new RemoveTempDir);

std::unique_ptr<IoBackend> Backend(bool uring) {
  if (!uring) return MakePreadBackend(4);
  auto b = MakeUringBackend(32);
  EXPECT_TRUE(b.ok()) << b.status();
  return std::move(*b);
}

class IoServiceTest : public ::testing::TestWithParam<bool> {};

TEST_P(IoServiceTest, OpenWriteReadStatClose) {
  const std::string path = TempDir() + "/a.bin";
  IoService io(Backend(GetParam()));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  IoOp open;
  open.kind = IoOp::Kind::kOpen;
  open.path = path.c_str();
  open.flags = O_CREAT | O_TRUNC | O_RDWR;
  const int64_t fd = io.Run(open, deadline);
  ASSERT_GE(fd, 0);
  std::string data(300000, 'x');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i % 251);
  IoOp w;
  w.kind = IoOp::Kind::kWrite;
  w.fd = static_cast<int>(fd);
  w.buf = data.data();
  w.len = data.size();
  EXPECT_EQ(io.Run(w, deadline), static_cast<int64_t>(data.size()));
  IoOp sync;
  sync.kind = IoOp::Kind::kFsync;
  sync.fd = static_cast<int>(fd);
  EXPECT_EQ(io.Run(sync, deadline), 0);
  struct statx stx;
  IoOp st;
  st.kind = IoOp::Kind::kStat;
  st.fd = static_cast<int>(fd);
  st.stx = &stx;
  EXPECT_EQ(io.Run(st, deadline), 0);
  EXPECT_EQ(stx.stx_size, data.size());
  std::string back(400000, '\0');
  IoOp r;
  r.kind = IoOp::Kind::kRead;
  r.fd = static_cast<int>(fd);
  r.buf = back.data();
  r.len = back.size();  // more than the file: stops at end of file
  EXPECT_EQ(io.Run(r, deadline), static_cast<int64_t>(data.size()));
  EXPECT_EQ(back.substr(0, data.size()), data);
  IoOp close;
  close.kind = IoOp::Kind::kClose;
  close.fd = static_cast<int>(fd);
  EXPECT_EQ(io.Run(close, deadline), 0);
  IoOp missing = open;
  const std::string nowhere = path + ".missing";
  missing.path = nowhere.c_str();
  missing.flags = O_RDONLY;
  EXPECT_EQ(io.Run(missing, deadline), -ENOENT);
}

INSTANTIATE_TEST_SUITE_P(Backends, IoServiceTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "io_uring" : "pread"; });

// Opens `path` through the service and returns the fd.
int OpenThrough(IoService& io, const std::string& path) {
  IoOp open;
  open.kind = IoOp::Kind::kOpen;
  open.path = path.c_str();
  open.flags = O_RDONLY;
  return static_cast<int>(io.Run(open, absl::Now() + absl::Seconds(10)));
}

// Opens beneath a root through each backend, by openat2 and by the walk:
// what stays beneath opens, what leads out fails with -EXDEV.
class BeneathOpenTest : public ::testing::TestWithParam<std::tuple<bool, ResolveMode>> {};

TEST_P(BeneathOpenTest, SymlinksOutOfTheRootFailAndThoseBeneathOpen) {
  const auto [uring, mode] = GetParam();
  if (mode == ResolveMode::kOpenat2 && !Openat2Supported()) GTEST_SKIP() << "no openat2";
  const std::string base = TempDir() + "/beneath_" + std::to_string(uring) + ResolveModeName(mode);
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(base + "/root/d");
  std::filesystem::create_directories(base + "/outside");
  ASSERT_TRUE(WriteFileAtomically(base + "/root/d/shard.tar", "shard").ok());
  ASSERT_TRUE(WriteFileAtomically(base + "/outside/secret", "secret").ok());
  std::filesystem::create_symlink("d/shard.tar", base + "/root/rel.tar");
  std::filesystem::create_symlink(base + "/root/d/shard.tar", base + "/root/abs.tar");
  std::filesystem::create_symlink(base + "/outside/secret", base + "/root/out.tar");
  std::filesystem::create_symlink("../outside", base + "/root/outdir");
  auto root = RootDir::Open(base + "/root", mode);
  ASSERT_TRUE(root.ok()) << root.status();
  IoService io(Backend(uring));
  auto open = [&](const char* name, int flags) {
    IoOp op;
    op.kind = IoOp::Kind::kOpen;
    op.root = root->get();
    op.path = name;
    op.flags = flags;
    op.mode = 0640;
    const int64_t fd = io.Run(op, absl::Now() + absl::Seconds(10));
    if (fd >= 0) ::close(static_cast<int>(fd));
    return fd >= 0 ? int64_t{0} : fd;
  };
  for (const char* ok : {"d/shard.tar", "rel.tar", "abs.tar"})
    EXPECT_EQ(open(ok, O_RDONLY), 0) << ok;
  EXPECT_EQ(open("out.tar", O_RDONLY), -EXDEV);
  EXPECT_EQ(open("outdir/secret", O_RDONLY), -EXDEV);
  EXPECT_EQ(open("../outside/secret", O_RDONLY), -EXDEV);
  EXPECT_EQ(open("outdir/new", O_WRONLY | O_CREAT), -EXDEV);
  EXPECT_FALSE(std::filesystem::exists(base + "/outside/new"));
  EXPECT_EQ(open("d/new.tar.tutti-partial", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW), 0);
  EXPECT_EQ(open("out.tar", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW), -ELOOP);
  std::filesystem::remove_all(base);
}
// A FIFO (or socket, or device) where a file is expected is refused at
// once, for reading and for writing, beneath a root or not: an open of a
// FIFO without a writer would otherwise block until its deadline (and hold
// a kernel worker). A regular file opens as before, blocking.
TEST_P(BeneathOpenTest, WhatIsNoRegularFileIsRefusedWithoutBlocking) {
  const auto [uring, mode] = GetParam();
  if (mode == ResolveMode::kOpenat2 && !Openat2Supported()) GTEST_SKIP() << "no openat2";
  const std::string base = TempDir() + "/fifo_" + std::to_string(uring) + ResolveModeName(mode);
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(base + "/root");
  ASSERT_EQ(::mkfifo((base + "/root/fifo.tar").c_str(), 0600), 0);
  ASSERT_TRUE(WriteFileAtomically(base + "/root/shard.tar", "shard").ok());
  auto root = RootDir::Open(base + "/root", mode);
  ASSERT_TRUE(root.ok()) << root.status();
  IoService io(Backend(uring));
  auto open = [&](const RootDir* r, const std::string& name, int flags, int* fl = nullptr) {
    IoOp op;
    op.kind = IoOp::Kind::kOpen;
    op.root = r;
    op.path = name.c_str();
    op.flags = flags;
    op.mode = 0640;
    // A blocked open shows as -ETIMEDOUT.
    const int64_t fd = io.Run(op, absl::Now() + absl::Seconds(10));
    if (fd >= 0 && fl != nullptr) *fl = ::fcntl(static_cast<int>(fd), F_GETFL);
    if (fd >= 0) ::close(static_cast<int>(fd));
    return fd >= 0 ? int64_t{0} : fd;
  };
  EXPECT_EQ(open(root->get(), "fifo.tar", O_RDONLY), kNotRegularFile);
  EXPECT_EQ(open(root->get(), "fifo.tar", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW),
            kNotRegularFile);
  EXPECT_EQ(open(nullptr, base + "/root/fifo.tar", O_RDONLY), kNotRegularFile);
  EXPECT_EQ(open(nullptr, "/dev/null", O_RDONLY), kNotRegularFile);
  int flags = 0;
  EXPECT_EQ(open(root->get(), "shard.tar", O_RDONLY, &flags), 0);
  EXPECT_EQ(flags & O_NONBLOCK, 0);
  EXPECT_EQ(open(root->get(), "new.tar", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, &flags), 0);
  EXPECT_EQ(flags & O_NONBLOCK, 0);
  std::filesystem::remove_all(base);
}

INSTANTIATE_TEST_SUITE_P(BackendsAndModes, BeneathOpenTest,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(ResolveMode::kOpenat2,
                                                              ResolveMode::kWalk)),
                         [](const auto& i) {
                           return std::string(std::get<0>(i.param) ? "io_uring_" : "pread_") +
                                  ResolveModeName(std::get<1>(i.param));
                         });

TEST(FaultInjectingTest, ShortReadsAndEagainAreResubmitted) {
  const std::string path = TempDir() + "/short.bin";
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 13);
  ASSERT_TRUE(WriteFileAtomically(path, data).ok());
  IoFault shorts;
  shorts.path_contains = "short.bin";
  shorts.short_len = 777;
  IoFault again = shorts;
  again.short_len = 0;
  again.eagain_times = 3;
  std::vector<IoFault> faults = {again, shorts};
  IoService io(std::make_unique<FaultInjectingBackend>(Backend(true), faults));
  const int fd = OpenThrough(io, path);
  ASSERT_GE(fd, 0);
  std::string back(data.size(), '\0');
  IoOp r;
  r.kind = IoOp::Kind::kRead;
  r.fd = fd;
  r.buf = back.data();
  r.len = back.size();
  EXPECT_EQ(io.Run(r, absl::Now() + absl::Seconds(10)), static_cast<int64_t>(data.size()));
  EXPECT_EQ(back, data);
  ::close(fd);
}

TEST(FaultInjectingTest, StalledReadTimesOutAndIsCancelled) {
  const std::string path = TempDir() + "/stall.bin";
  ASSERT_TRUE(WriteFileAtomically(path, std::string(4096, 'a')).ok());
  IoFault stall;
  stall.path_contains = "stall.bin";
  stall.stall = true;
  IoService io(std::make_unique<FaultInjectingBackend>(Backend(true), std::vector<IoFault>{stall}));
  const int fd = OpenThrough(io, path);
  ASSERT_GE(fd, 0);
  auto buf = std::make_shared<std::string>(4096, '\0');
  IoOp r;
  r.kind = IoOp::Kind::kRead;
  r.fd = fd;
  r.buf = buf->data();
  r.len = buf->size();
  const absl::Time start = absl::Now();
  EXPECT_EQ(io.Run(r, start + absl::Milliseconds(100), buf), -ETIMEDOUT);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ::close(fd);
}

// The process's descriptors open on `path`. Counted by what they refer to,
// not in total: a descriptor another test's late operation closes meanwhile
// does not count.
size_t FdsOpenOn(const std::string& path) {
  const std::string want = std::filesystem::canonical(path).string();
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code link_ec;
    const std::filesystem::path target = std::filesystem::read_symlink(e.path(), link_ec);
    if (!link_ec && target == want) ++n;
  }
  return n;
}

// An open answered -ETIMEDOUT that the kernel completes later all the same
// (an open cannot always be cancelled): the file it opened is closed, not
// left open with no owner. Both backends.
TEST(FaultInjectingTest, AnOpenThatCompletesAfterItsDeadlineIsClosed) {
  const std::string path = TempDir() + "/late.bin";
  ASSERT_TRUE(WriteFileAtomically(path, std::string(4096, 'a')).ok());
  for (bool uring : {false, true}) {
    IoFault late;
    late.path_contains = "late.bin";
    late.kind = IoOp::Kind::kOpen;
    late.delay = absl::Milliseconds(300);
    late.uncancellable = true;
    IoService io(std::make_unique<FaultInjectingBackend>(Backend(uring), std::vector<IoFault>{late}));
    ASSERT_EQ(FdsOpenOn(path), 0u);
    IoOp open;
    open.kind = IoOp::Kind::kOpen;
    open.path = path.c_str();
    open.flags = O_RDONLY;
    EXPECT_EQ(io.Run(open, absl::Now() + absl::Milliseconds(20)), -ETIMEDOUT);
    for (int i = 0; i < 1000 && io.outstanding() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
    ASSERT_EQ(io.outstanding(), 0u) << "the late open never completed";
    EXPECT_EQ(FdsOpenOn(path), 0u) << (uring ? "io_uring" : "pread") << ": the late open's fd leaked";
  }
}

TEST(FaultInjectingTest, WriteLimitGivesEnospc) {
  const std::string path = TempDir() + "/full.bin";
  IoService io(std::make_unique<FaultInjectingBackend>(Backend(false), std::vector<IoFault>{},
                                                       /*write_limit_bytes=*/1000));
  IoOp open;
  open.kind = IoOp::Kind::kOpen;
  open.path = path.c_str();
  open.flags = O_CREAT | O_TRUNC | O_WRONLY;
  const int fd = static_cast<int>(io.Run(open, absl::Now() + absl::Seconds(10)));
  ASSERT_GE(fd, 0);
  std::string data(4096, 'z');
  IoOp w;
  w.kind = IoOp::Kind::kWrite;
  w.fd = fd;
  w.buf = data.data();
  w.len = data.size();
  EXPECT_EQ(io.Run(w, absl::Now() + absl::Seconds(10)), -ENOSPC);
  ::close(fd);
}

}  // namespace
}  // namespace tutti

namespace tutti {
namespace {

TEST(IoBackendChoiceTest, NamesParseAndPreadNeedsNoRing) {
  EXPECT_EQ(*ParseIoBackendChoice("auto"), IoBackendChoice::kAuto);
  EXPECT_EQ(*ParseIoBackendChoice("uring"), IoBackendChoice::kUring);
  EXPECT_EQ(*ParseIoBackendChoice("pread"), IoBackendChoice::kPread);
  absl::StatusOr<IoBackendChoice> bad = ParseIoBackendChoice("aio");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--io_backend 'aio'"), std::string::npos);
  EXPECT_FALSE(*ResolveIoBackend(IoBackendChoice::kPread));
  // Where this kernel lets the process set up a ring, auto and uring take it
  // (the refused case runs under a seccomp profile: tests/deploy/test_seccomp.py).
  if (MakeUringBackend(1).ok()) {
    EXPECT_TRUE(*ResolveIoBackend(IoBackendChoice::kAuto));
    EXPECT_TRUE(*ResolveIoBackend(IoBackendChoice::kUring));
  }
}

}  // namespace
}  // namespace tutti
