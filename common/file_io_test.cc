#include "common/file_io.h"

#include <unistd.h>

#include <cstdlib>

#include "gtest/gtest.h"

namespace tutti {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/tutti_fileio_XXXXXX";
  return mkdtemp(tmpl);
}

TEST(FileIoTest, AtomicWriteThenRead) {
  std::string dir = TempDir();
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

TEST(FileIoTest, JoinUnderRefusesEscapes) {
  EXPECT_EQ(*JoinUnder("/data", "a/b.tar"), "/data/a/b.tar");
  EXPECT_EQ(JoinUnder("/data", "../etc/passwd").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(JoinUnder("/data", "a/../../x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(JoinUnder("/data", "/etc/passwd").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tutti
