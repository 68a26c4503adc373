#include "services/stager/plan_intake.h"

#include "gtest/gtest.h"

namespace tutti::stager {
namespace {

v1::StepPlan PlanOf(uint64_t step, const std::string& fingerprint = "") {
  v1::StepPlan p;
  p.set_step(step);
  p.set_config_fingerprint(fingerprint);
  return p;
}

TEST(PlanIntakeTest, AsksForTheStepsItHasRoomForCappedAtTheJobsEnd) {
  PlanIntake in(/*ahead=*/6, /*total_steps=*/10, "fp");
  EXPECT_EQ(in.next(), 0u);
  EXPECT_EQ(in.Limit(0), 6u);
  EXPECT_EQ(in.Limit(7), 10u);
  EXPECT_FALSE(in.Blocked(0));
  for (uint64_t s = 0; s < 6; ++s) {
    ASSERT_EQ(in.Classify(s, 0, 0), PlanIntake::Verdict::kTake);
    ASSERT_TRUE(in.Take(PlanOf(s, "fp")).ok());
  }
  EXPECT_TRUE(in.Blocked(0));   // no room until the window moves
  EXPECT_FALSE(in.Blocked(1));  // one step released: room for step 6
  EXPECT_EQ(in.Received(), "plans received up to step 5");
  PlanIntake open_ended(6, 0, "");
  EXPECT_EQ(open_ended.Limit(100), 106u);
  EXPECT_EQ(open_ended.Received(), "plans received up to step none");
}

TEST(PlanIntakeTest, RepeatedAndStalePlansAreToldApart) {
  PlanIntake in(4, 0, "");
  ASSERT_TRUE(in.Take(PlanOf(0)).ok());
  EXPECT_EQ(in.Classify(0, 0, 0), PlanIntake::Verdict::kHaveIt);
  EXPECT_EQ(in.Classify(1, 0, 2), PlanIntake::Verdict::kHaveIt);  // before the window
  in.Restart(7);
  EXPECT_EQ(in.next(), 7u);
  EXPECT_EQ(in.generation(), 1u);
  EXPECT_EQ(in.Classify(7, 0, 7), PlanIntake::Verdict::kStale);
  EXPECT_EQ(in.Classify(7, 1, 7), PlanIntake::Verdict::kTake);
}

TEST(PlanIntakeTest, APlanOfAnotherConfigIsRefusedNamingBothFingerprints) {
  PlanIntake in(4, 0, "abc");
  absl::Status s = in.Take(PlanOf(3, "xyz"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("fingerprint xyz but the job has abc"), std::string::npos) << s;
  EXPECT_EQ(in.next(), 4u);  // received all the same: the next step is asked for
  EXPECT_TRUE(in.Take(PlanOf(4, "")).ok());  // a packer that sends none is not checked
}

TEST(PlanIntakeTest, ThePackersFailureCoversItsStepAndLaterOnes) {
  PlanIntake in(4, 0, "");
  ASSERT_TRUE(in.Take(PlanOf(0)).ok());
  ASSERT_TRUE(in.Take(PlanOf(1)).ok());
  in.Failed(3, absl::OutOfRangeError("end of the dataset"), 0);
  in.Failed(5, absl::InternalError("later"), 0);  // the earliest is kept
  in.Failed(1, absl::InternalError("old stream"), 9);  // another generation: ignored
  EXPECT_FALSE(in.Covers(2));
  EXPECT_TRUE(in.Covers(4));
  EXPECT_TRUE(in.ErrorFor(2).ok());
  absl::Status s = in.ErrorFor(4);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s.message(), "the packer cannot serve step 3 (asked for step 4): end of the dataset");
  EXPECT_EQ(in.SlotError(3).message(), "the packer cannot serve step 3: end of the dataset");
  ASSERT_TRUE(in.Take(PlanOf(2)).ok());
  EXPECT_TRUE(in.Blocked(0));  // the next step is one the packer cannot serve
  in.Restart(0);  // a new generation forgets it
  EXPECT_FALSE(in.Covers(4));
  EXPECT_FALSE(in.Blocked(0));
}

TEST(PlanIntakeTest, ShardsToStageSkipRemoteLoadsAndKeepPlanOrder) {
  v1::StepPlan plan;
  for (const char* n : {"a.tar", "b.tar", "c.tar", "d.tar"}) plan.add_shards()->set_name(n);
  auto sample = [&](uint64_t id, uint32_t shard) {
    auto* s = plan.add_samples();
    s->set_sample_id(id);
    s->set_shard(shard);
  };
  sample(1, 2);
  sample(2, 0);
  sample(3, 3);
  sample(4, 1);
  auto* rank = plan.add_ranks();
  auto* images = rank->add_encoders();
  images->add_images()->set_sample_id(1);
  auto* remote = images->add_images();
  remote->set_sample_id(3);
  remote->set_remote_load(true);
  auto* doc = rank->add_micro_batches()->add_sequences()->add_docs();
  doc->set_sample_id(2);
  auto* remote_doc = rank->mutable_micro_batches(0)->mutable_sequences(0)->add_docs();
  remote_doc->set_sample_id(4);
  remote_doc->set_remote_load(true);
  std::vector<std::string> names;
  for (const v1::ShardRef* ref : ShardsToStage(plan)) names.push_back(ref->name());
  EXPECT_EQ(names, (std::vector<std::string>{"a.tar", "c.tar"}));
  // With locality: the shards this node is home to that other nodes' ranks
  // read follow, in their order, each once (d.tar only through a remote
  // load here, e.tar not by this node's ranks at all, c.tar already staged).
  for (const char* n : {"e.tar", "c.tar", "d.tar"}) plan.add_held_shards()->set_name(n);
  names.clear();
  for (const v1::ShardRef* ref : ShardsToStage(plan)) names.push_back(ref->name());
  EXPECT_EQ(names, (std::vector<std::string>{"a.tar", "c.tar", "e.tar", "d.tar"}));
}

}  // namespace
}  // namespace tutti::stager
