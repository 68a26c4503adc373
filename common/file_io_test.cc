#include "common/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"

#include "gtest/gtest.h"

namespace tutti {
namespace {

// A new directory under the test's temporary directory, removed when the
// test ends.
class ScopedDir {
 public:
  ScopedDir() {
    std::string tmpl = ::testing::TempDir() + "/tutti_fileio_XXXXXX";
    path_ = mkdtemp(tmpl.data()) != nullptr ? tmpl : "";
  }
  ~ScopedDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  operator std::string() const { return path_; }

 private:
  std::string path_;
};

TEST(FileIoTest, AtomicWriteThenRead) {
  ScopedDir scoped;
  const std::string dir = scoped;
  std::string path = dir + "/f.bin";
  ASSERT_TRUE(WriteFileAtomically(path, "hello").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "world!").ok());
  auto s = ReadFileToString(path);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, "world!");
  auto f = OpenLocalFile(path);
  ASSERT_TRUE(f.ok());
  char buf[4];
  EXPECT_TRUE((*f)->ReadExactly(1, 3, buf).ok());
  EXPECT_EQ(std::string(buf, 3), "orl");
  auto bad = (*f)->ReadExactly(4, 10, buf);
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.message().find(path), std::string::npos);
}

TEST(FileIoTest, MissingFileIsNotFound) {
  auto f = OpenLocalFile("/nonexistent/dir/file");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find("/nonexistent/dir/file"), std::string::npos);
}

// A FIFO nobody writes, /dev/null and a directory are refused by name at
// once: the open does not wait for a writer. The read runs on a thread and,
// should it block, a writer is opened to release it and the test fails.
TEST(FileIoTest, WhatIsNoRegularFileIsRefusedWithoutBlocking) {
  ScopedDir scoped;
  const std::string dir = scoped;
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  struct Case {
    std::string path;
    const char* what;
  };
  for (const Case& c : {Case{fifo, "a FIFO"}, Case{"/dev/null", "a device"},
                        Case{dir, "a directory"}}) {
    auto result = std::make_shared<absl::StatusOr<std::string>>();
    auto done = std::make_shared<absl::Notification>();
    std::thread reader([path = c.path, result, done] {
      *result = ReadFileToString(path);
      done->Notify();
    });
    const bool returned = done->WaitForNotificationWithTimeout(absl::Seconds(20));
    if (!returned) {  // release the blocked open: a writer comes and goes
      const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (w >= 0) ::close(w);
    }
    reader.join();
    ASSERT_TRUE(returned) << c.path << ": the read blocked";
    EXPECT_EQ(result->status().code(), absl::StatusCode::kInvalidArgument) << result->status();
    EXPECT_NE(result->status().message().find(c.path + " is not a regular file (" + c.what + ")"),
              std::string::npos)
        << result->status();
    EXPECT_EQ(OpenLocalFile(c.path).status().code(), absl::StatusCode::kInvalidArgument);
  }
  ::unlink(fifo.c_str());
  ::rmdir(dir.c_str());
}

TEST(FileIoTest, JoinUnderRefusesEscapes) {
  EXPECT_EQ(*JoinUnder("/data", "a/b.tar"), "/data/a/b.tar");
  EXPECT_EQ(JoinUnder("/data", "../etc/passwd").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(JoinUnder("/data", "a/../../x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(JoinUnder("/data", "/etc/passwd").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tutti
