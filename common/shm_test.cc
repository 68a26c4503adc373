#include "common/shm.h"

#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tutti {
namespace {

TEST(ShmTest, CreateOpenUnlink) {
  std::string name = absl::StrCat("/tutti-test-", getpid());
  auto seg = ShmSegment::Create(name, 4096);
  ASSERT_TRUE(seg.ok()) << seg.status();
  std::memcpy((*seg)->data(), "batch", 5);
  auto view = ShmSegment::Open(name, /*writable=*/false);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ((*view)->size(), 4096u);
  EXPECT_EQ(std::string((*view)->data(), 5), "batch");
  ShmSegment::Unlink(name);
  EXPECT_EQ(ShmSegment::Open(name, false).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string((*view)->data(), 5), "batch");  // mapping outlives the name
}

TEST(ShmTest, CreateNeverReplacesAnExistingSegment) {
  const std::string name = absl::StrCat("/tutti-test-excl-", getpid());
  auto first = ShmSegment::Create(name, 4096);
  ASSERT_TRUE(first.ok()) << first.status();
  std::memcpy((*first)->data(), "mine", 4);
  auto second = ShmSegment::Create(name, 8192);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(second.status().message().find(name), std::string::npos) << second.status();
  auto view = ShmSegment::Open(name, false);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ((*view)->size(), 4096u);
  EXPECT_EQ(std::string((*view)->data(), 4), "mine");
  ShmSegment::Unlink(name);
}

TEST(ShmTest, UnlinkWithPrefixRemovesOnlyThoseNames) {
  const std::string ours = absl::StrCat("/tutti-test-prefix-", getpid(), "-a-");
  const std::string other = absl::StrCat("/tutti-test-prefix-", getpid(), "-b-");
  for (const std::string& n : {ours + "1", ours + "2", other + "1"}) {
    ASSERT_TRUE(ShmSegment::Create(n, 16).ok()) << n;
  }
  auto removed = ShmSegment::UnlinkWithPrefix(ours);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 2);
  EXPECT_FALSE(ShmSegment::Open(ours + "1", false).ok());
  EXPECT_TRUE(ShmSegment::Open(other + "1", false).ok());
  ShmSegment::Unlink(other + "1");
  EXPECT_EQ(ShmSegment::UnlinkWithPrefix("no-slash").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tutti
