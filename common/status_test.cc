#include "common/status.h"

#include <cerrno>

#include "gtest/gtest.h"

namespace tutti {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

absl::Status Check(int x) {
  RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusTest, MacrosPropagate) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Check(2).ok());
  EXPECT_FALSE(Check(3).ok());
}

TEST(StatusTest, ErrnoMapsCodes) {
  EXPECT_EQ(ErrnoStatus(ENOENT, "open x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoStatus(ENOSPC, "write x").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(ErrnoStatus(ENOENT, "open /a/b").message().find("/a/b"), std::string::npos);
  auto s = Annotate(absl::NotFoundError("inner"), "outer");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "outer: inner");
}

}  // namespace
}  // namespace tutti
