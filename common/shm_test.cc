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

}  // namespace
}  // namespace tutti
