#include "services/packer/bench/exchange_bench.h"

#include <gtest/gtest.h>

namespace tutti::packer {
namespace {

TEST(ExchangeBenchTest, RowsPerModeWithGlpkOnTheSubInstance) {
  ExchangeBenchOptions o;
  o.world_sizes = {16};
  o.workload.seq_len = 8192;
  o.samples = 20000;
  o.plan_repeats = 1;
  o.glpk_time_limit_s = 10;
  std::vector<std::string> said;
  o.progress = [&](const std::string& s) { said.push_back(s); };
  auto rows = RunExchangeBench(o);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 3u);
  EXPECT_EQ((*rows)[0].mode, "none");
  EXPECT_EQ((*rows)[1].mode, "pre");
  const ExchangeBenchRow& post = (*rows)[2];
  EXPECT_EQ(post.mode, "post");
  EXPECT_EQ(post.ranks, 16u);
  EXPECT_LT(post.encoder_imbalance, (*rows)[0].encoder_imbalance);
  EXPECT_LT(post.llm_imbalance, (*rows)[0].llm_imbalance);
  EXPECT_LE(post.inter_node_bytes, post.inter_node_bytes_oblivious / 2);
  ASSERT_TRUE(post.plan_ms_median.has_value());
  EXPECT_FALSE(said.empty());
  if (post.glpk_gap) {
    EXPECT_GE(*post.glpk_gap, 0.0);
    EXPECT_LE(*post.glpk_gap, 0.01);
  } else {
    EXPECT_NE(post.glpk_status.find("no result"), std::string::npos) << post.glpk_status;
  }
  const std::string json = FormatExchangeJson(*rows);
  for (const char* key : {"\"mode\": \"post\"", "\"ranks\": 16", "\"encoder_imbalance\"",
                          "\"llm_imbalance\"", "\"inter_node_bytes\"",
                          "\"inter_node_bytes_oblivious\"", "\"glpk_gap\"", "\"plan_ms_median\""}) {
    EXPECT_NE(json.find(key), std::string::npos) << key;
  }
  EXPECT_NE(json.find("\"plan_ms_median\": null"), std::string::npos);  // none/pre rows
  const std::string table = FormatExchangeTable(*rows);
  EXPECT_NE(table.find("post"), std::string::npos);
}

TEST(ExchangeBenchTest, PreStrategyIsPlannedAndErrorsPropagate) {
  ExchangeBenchOptions o;
  o.world_sizes = {8};
  o.workload.seq_len = 8192;
  o.samples = 20000;
  o.workload.fill = 0.7;
  o.plan_repeats = 1;
  o.glpk_max_world = 0;
  o.pre_strategy = "greedy";
  auto rows = RunExchangeBench(o);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_TRUE((*rows)[1].error.empty()) << (*rows)[1].error;
  o.pre_strategy = "tutti";
  auto tutti = RunExchangeBench(o);
  ASSERT_TRUE(tutti.ok()) << tutti.status();
  // The same step: the balancing strategy beats the greedy one on ViT cost.
  EXPECT_LT((*tutti)[1].encoder_imbalance, (*rows)[1].encoder_imbalance);
  EXPECT_EQ((*rows)[0].encoder_imbalance, (*tutti)[0].encoder_imbalance);
  EXPECT_EQ((*rows)[2].glpk_status, "not run");
  o.pre_strategy = "no-such-strategy";
  auto failed = RunExchangeBench(o);
  ASSERT_TRUE(failed.ok());
  EXPECT_NE((*failed)[1].error.find("no-such-strategy"), std::string::npos) << (*failed)[1].error;
  EXPECT_TRUE((*failed)[2].error.empty());
  EXPECT_NE(FormatExchangeTable(*failed).find("pre        8 failed: "), std::string::npos)
      << FormatExchangeTable(*failed);
  EXPECT_NE(FormatExchangeJson(*failed).find("no-such-strategy"), std::string::npos);
  o.workload.ranks_per_node = 3;
  EXPECT_FALSE(RunExchangeBench(o).ok());
}

TEST(ExchangeBenchTest, TransportHookSeesEveryPostPlan) {
  // A transport that reports the plan's own bytes (what a real one moves).
  uint32_t calls = 0;
  const TransportBenchFn fake =
      [&calls](const Job& job, const StepPlanData& plan) -> absl::StatusOr<TransportBenchResult> {
    ++calls;
    EXPECT_EQ(plan.world_size, job.world_size());
    EXPECT_FALSE(plan.samples.empty());
    const double bytes = double(plan.inter_node_bytes + plan.intra_node_bytes);
    TransportBenchResult r{bytes, bytes, 1.0};
    r.client_seconds = r.bare_seconds = 0.002;
    r.bytes_per_rank_max = 1000000;
    r.messages_per_pair = 1;
    return r;
  };
  const TransportBenchFn* fn = &fake;
  ExchangeBenchOptions o;
  o.world_sizes = {8};
  o.workload.seq_len = 8192;
  o.samples = 20000;
  o.workload.fill = 0.7;
  o.plan_repeats = 1;
  o.glpk_max_world = 0;
  o.transport = fn;
  auto rows = RunExchangeBench(o);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_TRUE((*rows)[2].client_vs_bare_throughput.has_value());
  EXPECT_EQ(calls, 1u);  // the post row only
  EXPECT_NE(FormatExchangeJson(*rows).find("\"client_vs_bare_throughput\": 1"), std::string::npos);
  EXPECT_NE(FormatExchangeJson(*rows).find("\"exchange_bytes_per_rank\": 1000000"),
            std::string::npos);
  EXPECT_NE(FormatExchangeJson(*rows).find("\"messages_per_pair\": 1,"), std::string::npos);
  EXPECT_NE(FormatExchangeTable(*rows).find("client/bare"), std::string::npos);
  EXPECT_NE(FormatExchangeTable(*rows).find("msg/pair"), std::string::npos);
}

}  // namespace
}  // namespace tutti::packer
