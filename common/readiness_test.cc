#include "common/readiness.h"

#include <vector>

#include "gtest/gtest.h"

namespace tutti {
namespace {

TEST(ReadinessTest, ReadyOnlyWhenEveryConditionIsMetAndNotShuttingDown) {
  Readiness r;
  EXPECT_TRUE(r.ready());  // nothing required
  r.Require("index", "loading the index");
  r.Require("plans", "no plan yet");
  EXPECT_EQ(r.Check().message(), "index: loading the index");
  r.Set("plans", absl::OkStatus());
  EXPECT_EQ(r.Check().message(), "index: loading the index");
  r.Set("index", absl::OkStatus());
  EXPECT_TRUE(r.ready());
  r.Set("index", absl::UnavailableError("the index file vanished"));
  EXPECT_EQ(r.Check().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(r.Check().message(), "index: the index file vanished");
  r.Set("index", absl::OkStatus());
  r.Require("index", "loading");  // already known: unchanged
  EXPECT_TRUE(r.ready());
  r.ShuttingDown();
  EXPECT_EQ(r.Check().message(), "shutting down");
  r.Set("index", absl::OkStatus());
  EXPECT_FALSE(r.ready());
}

TEST(ReadinessTest, TheWatcherSeesEveryFlipInOrder) {
  Readiness r;
  r.Require("packer", "waiting for the packer");
  std::vector<bool> seen;
  r.Watch([&](bool ready) { seen.push_back(ready); });
  r.Set("packer", absl::UnavailableError("still down"));  // no flip
  r.Set("packer", absl::OkStatus());
  r.Set("source", absl::OkStatus());  // no flip
  r.Set("source", absl::UnavailableError("stalls"));
  r.ShuttingDown();  // already not ready: no flip
  EXPECT_EQ(seen, (std::vector<bool>{false, true, false}));
  r.Watch(nullptr);
  r.Set("source", absl::OkStatus());
  EXPECT_EQ(seen.size(), 3u);
}

}  // namespace
}  // namespace tutti
