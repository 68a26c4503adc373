// The daemons' /metrics as a real Prometheus sees them: a tutti-packerd and a
// tutti-stagerd serve a few steps to two ranks, Prometheus (the Debian
// package's binary) scrapes both every second with deploy/prometheus's job
// names and alert rules, and its HTTP API must report both targets up, the
// counters that matter above zero, and every alert rule evaluating cleanly.
// Skips when the prometheus binary is not installed.
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/e2e_client.h"
#include "tests/e2e_support.h"

namespace tutti::e2e {
namespace {

constexpr char kPrometheus[] = "/usr/bin/prometheus";

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

absl::StatusOr<google::protobuf::Struct> GetJson(int port, const std::string& target) {
  auto body = HttpGet(port, target);
  if (!body.ok()) return body.status();
  google::protobuf::Struct json;
  auto s = google::protobuf::util::JsonStringToMessage(*body, &json);
  if (!s.ok())
    return absl::DataLossError(absl::StrCat(target, ": not JSON: ", body->substr(0, 300)));
  if (json.fields().at("status").string_value() != "success") {
    return absl::InternalError(absl::StrCat(target, ": ", *body));
  }
  return json;
}

// The values of an instant query, one per series; empty when none.
absl::StatusOr<std::vector<double>> Query(int port, const std::string& promql) {
  auto json = GetJson(port, "/api/v1/query?query=" + UrlEncode(promql));
  if (!json.ok()) return json.status();
  std::vector<double> values;
  for (const auto& series :
       json->fields().at("data").struct_value().fields().at("result").list_value().values()) {
    const auto& value = series.struct_value().fields().at("value").list_value();
    double v = 0;
    if (value.values_size() == 2 && absl::SimpleAtod(value.values(1).string_value(), &v)) {
      values.push_back(v);
    }
  }
  return values;
}

// Every alert rule's "health" ("ok" once evaluated without error) and error.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> RuleHealth(int port) {
  auto json = GetJson(port, "/api/v1/rules");
  if (!json.ok()) return json.status();
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& group :
       json->fields().at("data").struct_value().fields().at("groups").list_value().values()) {
    for (const auto& rule : group.struct_value().fields().at("rules").list_value().values()) {
      const auto& f = rule.struct_value().fields();
      const std::string error = f.count("lastError") ? f.at("lastError").string_value() : "";
      out.emplace_back(f.at("name").string_value(),
                       f.at("health").string_value() + (error.empty() ? "" : ": " + error));
    }
  }
  return out;
}

TEST(Prometheus, ScrapesThePackerAndTheStager) {
  if (::access(kPrometheus, X_OK) != 0) {
    GTEST_SKIP() << kPrometheus << " is not installed (Debian package prometheus)";
  }
  const std::string dir = MakeTempDir("prometheus");
  ASSERT_TRUE(GenerateDataset(dir + "/ds").ok());
  ASSERT_TRUE(BuildIndex(dir + "/ds", dir + "/index.tutti").ok());
  auto cluster = Cluster::Start({.dir = dir,
                                 .job_config = JobConfigText(dir + "/index.tutti", 0),
                                 .source = dir + "/ds",
                                 .nodes = 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  // Two ranks of node 0 pull a few steps and report their timings.
  for (int rank : {0, 1}) {
    auto client = Client::Connect(
        RankOptions((*cluster)->stager(0).address(), (*cluster)->packer().address(), rank, 4));
    ASSERT_TRUE(client.ok()) << client.status();
    for (int step = 0; step < 3; ++step) {
      auto batch = (*client)->Next();
      ASSERT_TRUE(batch.ok()) << batch.status();
      EXPECT_TRUE(
          (*client)->ReportTiming(batch->step(), {{"data_wait", batch->wait_seconds()}}).ok());
      ASSERT_TRUE(batch->Release().ok());
    }
  }

  const int port = FreeLoopbackPort();
  const std::string config = dir + "/prometheus.yml";
  std::ofstream(config)
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      << "rule_files:\n  - " << TUTTI_SOURCE_DIR << "/deploy/prometheus/alerts.yml\n"
      << "scrape_configs:\n"
      << "  - job_name: tutti-packerd\n    static_configs:\n      - targets: ['127.0.0.1:"
      << (*cluster)->packer().metrics_port() << "']\n"
      << "  - job_name: tutti-stagerd\n    static_configs:\n      - targets: ['127.0.0.1:"
      << (*cluster)->stager(0).metrics_port() << "']\n";
  auto prom = Process::Start(
      {kPrometheus, "--config.file=" + config, "--storage.tsdb.path=" + dir + "/tsdb",
       absl::StrCat("--web.listen-address=127.0.0.1:", port), "--log.level=warn"},
      dir + "/prometheus.log");
  ASSERT_TRUE(prom.ok()) << prom.status();

  // Wait (bounded) until two scrapes of each target and a rule evaluation
  // have happened.
  struct Check {
    std::string query;
    double at_least;
  };
  const std::vector<Check> checks = {
      {"up{job=\"tutti-packerd\"}", 1},
      {"up{job=\"tutti-stagerd\"}", 1},
      {"tutti_stager_staged_bytes_total", 1},
      {"tutti_stager_staged_files_total", 1},
      {"tutti_stager_batches_built_total", 6},
      {"tutti_stager_client_wait_seconds_count", 6},
      {"tutti_packer_samples_planned_total", 1},
      {"tutti_packer_plan_seconds_count", 1},
      {"tutti_packer_timing_reports_total{result=\"accepted\"}", 6},
      {"count(tutti_stager_decode_seconds_bucket)", 2},
      {"scrape_samples_scraped{job=\"tutti-stagerd\"}", 10},
      {"scrape_samples_scraped{job=\"tutti-packerd\"}", 10},
  };
  std::string last;
  bool all = false;
  for (absl::Time give_up = absl::Now() + absl::Seconds(45); !all && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(500));
    ASSERT_TRUE((*prom)->Running()) << "prometheus exited:\n" << Tail((*prom)->log());
    all = true;
    last.clear();
    for (const Check& c : checks) {
      auto v = Query(port, c.query);
      if (!v.ok() || v->size() != 1 || (*v)[0] < c.at_least) {
        all = false;
        absl::StrAppend(
            &last, c.query, " -> ",
            v.ok() ? (v->empty() ? "no series" : absl::StrCat((*v)[0])) : v.status().ToString(),
            " (want >= ", c.at_least, ")\n");
      }
    }
    auto rules = RuleHealth(port);
    if (!rules.ok() || rules->empty()) {
      all = false;
      absl::StrAppend(&last, "rules: ", rules.ok() ? "none loaded" : rules.status().ToString(),
                      "\n");
    } else {
      for (const auto& [name, health] : *rules) {
        if (health != "ok") {
          all = false;
          absl::StrAppend(&last, "rule ", name, ": ", health, "\n");
        }
      }
    }
  }
  EXPECT_TRUE(all) << "Prometheus never saw the expected series:\n"
                   << last << "prometheus log:\n"
                   << Tail((*prom)->log());

  (*prom)->Signal(SIGTERM);
  const std::optional<int> st = (*prom)->Wait(absl::Seconds(20));
  EXPECT_EQ(st, std::optional<int>(0)) << Tail((*prom)->log());
  absl::Status stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
  RemoveTree(dir);
}

}  // namespace
}  // namespace tutti::e2e
