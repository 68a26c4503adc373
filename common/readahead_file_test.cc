#include "common/readahead_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/crc32c.h"
#include "gtest/gtest.h"

namespace tutti {
namespace {

class ReadAheadFileTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "readahead_file_test_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    data_.resize(1'000'003);
    for (size_t i = 0; i < data_.size(); ++i) data_[i] = static_cast<char>((i * 7919) % 251);
    std::ofstream(dir_ + "/f.bin", std::ios::binary) << data_;
    auto root = RootDir::Open(dir_);
    ASSERT_TRUE(root.ok()) << root.status();
    root_ = std::move(*root);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<IoBackend> Backend(std::vector<IoFault> faults = {}) {
    std::unique_ptr<IoBackend> b;
    if (GetParam()) {
      auto u = MakeUringBackend(64);
      EXPECT_TRUE(u.ok()) << u.status();
      b = std::move(*u);
    } else {
      b = MakePreadBackend(8);
    }
    if (faults.empty()) return b;
    return std::make_unique<FaultInjectingBackend>(std::move(b), std::move(faults));
  }
  OpenedFile Open(IoService* io) {
    auto f = OpenThroughIoService(io, *root_, "f.bin", dir_ + "/f.bin", absl::Seconds(30));
    EXPECT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->size, data_.size());
    EXPECT_GT(f->mtime_ns, 0);
    return *f;
  }

  std::string dir_;
  std::string data_;
  std::unique_ptr<RootDir> root_;
};

// Forward reads of any size across chunk boundaries give the file's bytes,
// and every byte reaches `consume` once, in order.
TEST_P(ReadAheadFileTest, ReadsForwardAndConsumesEveryByteOnce) {
  IoService io(Backend());
  const OpenedFile f = Open(&io);
  ReadAheadOptions o;
  o.chunk_bytes = 8192;
  o.depth = 3;
  uint64_t next = 0;
  uint32_t crc = 0;
  ReadAheadFile file(&io, f.fd, f.size, "f.bin", o, [&](uint64_t off, absl::string_view b) {
    EXPECT_EQ(off, next);
    next += b.size();
    crc = Crc32cExtend(crc, b.data(), b.size());
  });
  uint64_t off = 0;
  for (size_t n : {512, 512, 100000, 1, 4096, 70000, 0, 300}) {
    std::string got(n, '\0');
    ASSERT_TRUE(file.ReadExactly(off, n, got.data()).ok()) << off;
    EXPECT_EQ(got, data_.substr(off, n)) << off;
    off += n + 12345;  // skip ahead, as a tar walk over member data does
  }
  // The same start again (a header read growing), then the tail.
  std::string again(9000, '\0');
  off -= 12345 + 300;
  ASSERT_TRUE(file.ReadExactly(off, again.size(), again.data()).ok());
  EXPECT_EQ(again, data_.substr(off, again.size()));
  size_t got = 0;
  std::string tail(100, '\0');
  ASSERT_TRUE(file.ReadAt(data_.size() - 10, 100, tail.data(), &got).ok());
  EXPECT_EQ(got, 10u);
  ASSERT_TRUE(file.Drain().ok());
  EXPECT_EQ(next, data_.size());
  EXPECT_EQ(crc, Crc32c(data_));
  EXPECT_EQ(file.reads(), (data_.size() + 8191) / 8192);
  // Behind the window: refused, not served stale.
  std::string back(10, '\0');
  EXPECT_EQ(file.ReadAt(0, 10, back.data(), &got).code(), absl::StatusCode::kFailedPrecondition);
}

// A failed read fails the read that needs it and every later call, naming
// the file and the offset; nothing after it is consumed.
TEST_P(ReadAheadFileTest, AFailedReadFailsTheFile) {
  IoFault eio;
  eio.path_contains = "f.bin";
  eio.error = EIO;
  eio.min_offset = 40960;
  IoService io(Backend({eio}));
  const OpenedFile f = Open(&io);
  ReadAheadOptions o;
  o.chunk_bytes = 4096;
  o.depth = 4;
  uint64_t consumed = 0;
  ReadAheadFile file(&io, f.fd, f.size, "f.bin", o,
                     [&](uint64_t, absl::string_view b) { consumed += b.size(); });
  std::string buf(100, '\0');
  ASSERT_TRUE(file.ReadExactly(1000, 100, buf.data()).ok());
  absl::Status s = file.ReadExactly(50000, 100, buf.data());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("f.bin"), std::string::npos) << s;
  EXPECT_NE(s.message().find("40960"), std::string::npos) << s;
  EXPECT_FALSE(file.Drain().ok());
  EXPECT_EQ(consumed, 40960u);
}

// A read the file system never answers fails the file at its deadline,
// naming the file and the offset; the file can then be dropped.
TEST_P(ReadAheadFileTest, AStalledReadFailsAtItsDeadline) {
  IoFault stall;
  stall.path_contains = "f.bin";
  stall.stall = true;
  stall.min_offset = 8192;
  IoService io(Backend({stall}));
  const OpenedFile f = Open(&io);
  ReadAheadOptions o;
  o.chunk_bytes = 4096;
  o.depth = 2;
  o.read_timeout = absl::Seconds(1);
  auto file = std::make_unique<ReadAheadFile>(&io, f.fd, f.size, "f.bin", o, nullptr);
  std::string buf(100, '\0');
  ASSERT_TRUE(file->ReadExactly(4000, 100, buf.data()).ok());
  absl::Status s = file->ReadExactly(9000, 100, buf.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("f.bin at offset 8192"), std::string::npos) << s;
  file.reset();
}

// One read at a time, each where it is asked for.
TEST_P(ReadAheadFileTest, IoServiceFileReadsWhereAsked) {
  IoService io(Backend());
  const OpenedFile f = Open(&io);
  IoServiceFile file(&io, f.fd, f.size, "f.bin", absl::Seconds(30));
  std::string got(777, '\0');
  ASSERT_TRUE(file.ReadExactly(500000, got.size(), got.data()).ok());
  EXPECT_EQ(got, data_.substr(500000, got.size()));
  ASSERT_TRUE(file.ReadExactly(3, got.size(), got.data()).ok());  // backwards is fine
  EXPECT_EQ(got, data_.substr(3, got.size()));
  EXPECT_FALSE(file.ReadExactly(data_.size() - 5, 10, got.data()).ok());  // past the end
}

TEST_P(ReadAheadFileTest, OpenRefusesWhatTheStagerRefuses) {
  IoService io(Backend());
  ASSERT_EQ(::mkfifo((dir_ + "/fifo.tar").c_str(), 0600), 0);
  auto fifo = OpenThroughIoService(&io, *root_, "fifo.tar", "fifo.tar", absl::Seconds(30));
  ASSERT_FALSE(fifo.ok());
  EXPECT_NE(fifo.status().message().find("not a regular file"), std::string::npos) << fifo.status();
  std::filesystem::create_symlink("/etc/hostname", dir_ + "/out.tar");
  auto out = OpenThroughIoService(&io, *root_, "out.tar", "out.tar", absl::Seconds(30));
  ASSERT_FALSE(out.ok());
  auto missing = OpenThroughIoService(&io, *root_, "none.tar", "none.tar", absl::Seconds(30));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("none.tar"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Backends, ReadAheadFileTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "uring" : "pread"; });

}  // namespace
}  // namespace tutti
