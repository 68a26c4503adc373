#include "services/stager/window/rank_processes.h"

#include <cstring>
#include <string>

#include "common/security_options.h"
#include "gtest/gtest.h"

namespace tutti::stager {
namespace {

// Counts up from a fixed start, so incarnations and keys are known to the test.
RankProcesses::Random Counting() {
  return [n = uint8_t{0}](void* out, size_t size) mutable {
    auto* p = static_cast<unsigned char*>(out);
    for (size_t i = 0; i < size; ++i) p[i] = ++n;
  };
}

TEST(RankProcessesTest, OnlyTheRegisteredProcessActsForItsRank) {
  RankProcesses ranks(Counting());
  // Before any process registers, a call naming none acts for the rank.
  EXPECT_TRUE(ranks.Check(2, {}).ok());
  uint64_t replaced = 1;
  const ProcessKey a = ranks.Register(2, &replaced);
  EXPECT_EQ(replaced, 0u);
  EXPECT_NE(a.incarnation, 0u);
  EXPECT_EQ(a.key.size(), RankProcesses::kKeyBytes);
  EXPECT_EQ(ranks.Current(2), a.incarnation);
  EXPECT_TRUE(ranks.Check(2, a).ok());

  // No incarnation, an invented one, the right one with another key or for
  // another rank: refused.
  absl::Status none = ranks.Check(2, {});
  EXPECT_EQ(none.code(), absl::StatusCode::kPermissionDenied) << none;
  EXPECT_NE(none.message().find("naming no incarnation"), std::string::npos) << none;
  absl::Status invented = ranks.Check(2, {a.incarnation + 1000, a.key});
  EXPECT_EQ(invented.code(), absl::StatusCode::kNotFound) << invented;
  EXPECT_NE(invented.message().find(kUnknownIncarnation), std::string::npos) << invented;
  EXPECT_EQ(ranks.Check(2, {0x5eed, ""}).code(), absl::StatusCode::kNotFound);
  ProcessKey stolen = a;
  stolen.key[0] ^= 1;
  absl::Status wrong = ranks.Check(2, stolen);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kPermissionDenied) << wrong;
  EXPECT_EQ(wrong.message().find(a.key), std::string::npos);  // the key is never echoed
  EXPECT_EQ(ranks.Check(2, {a.incarnation, ""}).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ranks.Check(3, a).code(), absl::StatusCode::kPermissionDenied);  // rank 2's
  EXPECT_TRUE(ranks.Check(3, {}).ok());  // rank 3: no process registered yet

  // A new process of rank 2: the old one must stop, however many came since.
  const ProcessKey b = ranks.Register(2, &replaced);
  EXPECT_EQ(replaced, a.incarnation);
  EXPECT_NE(b.key, a.key);
  EXPECT_TRUE(ranks.Check(2, b).ok());
  for (int i = 0; i < 10; ++i) ranks.Register(3, &replaced);
  absl::Status old = ranks.Check(2, a);
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition) << old;
  EXPECT_NE(old.message().find("must stop"), std::string::npos) << old;
}

TEST(RankProcessesTest, TwoStagersIssueDifferentIncarnationsAndKeys) {
  // A restarted stager (the kernel's randomness) knows none of its
  // predecessor's incarnations.
  RankProcesses before, after;
  uint64_t replaced = 0;
  const ProcessKey a = before.Register(0, &replaced);
  const ProcessKey b = after.Register(0, &replaced);
  EXPECT_NE(a.incarnation, b.incarnation);
  EXPECT_NE(a.key, b.key);
  EXPECT_EQ(after.Check(0, a).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tutti::stager
