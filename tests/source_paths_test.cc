// The stager opens shard files only beneath --source and --cache, through
// the real tutti-stagerd and `tutti stage`: after indexing, shards are
// replaced by a symlink to a 0600 file outside the source, by a symlink
// through a directory outside, by a symlink whose ".." climbs out, and by a
// symlink to a copy elsewhere beneath the source. The first three are never
// read (their samples are skipped with reason "outside_root", counted and
// logged, the job goes on); the last keeps working. Both the openat2 path
// and the checked walk (--path_resolve=walk) are run.
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e_client.h"
#include "tests/e2e_support.h"
#include "tutti/v1/stager.pb.h"

namespace tutti::e2e {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A dataset of 8 shards, indexed, then rearranged: shards 0, 2 and 3 lead
// outside the source, shard 1 is a symlink to its bytes moved beneath it.
struct Layout {
  std::string dir, source, index, outside;
  std::vector<std::string> shards;  // names, as the index has them
};

Layout MakeLayout(const std::string& name) {
  Layout l;
  l.dir = MakeTempDir(name);
  l.source = l.dir + "/ds";
  l.index = l.dir + "/index.tutti";
  l.outside = l.dir + "/outside";
  absl::Status s = GenerateDataset(l.source, {"--samples=96", "--samples-per-shard=12"});
  EXPECT_TRUE(s.ok()) << s;
  s = BuildIndex(l.source, l.index);
  EXPECT_TRUE(s.ok()) << s;
  for (const auto& e : fs::recursive_directory_iterator(l.source)) {
    if (e.path().extension() == ".tar") {
      l.shards.push_back(fs::relative(e.path(), l.source).string());
    }
  }
  std::sort(l.shards.begin(), l.shards.end());
  EXPECT_EQ(l.shards.size(), 8u);
  if (l.shards.size() < 8) return l;
  fs::create_directories(l.outside + "/dir");
  fs::create_directories(l.source + "/moved");
  auto path = [&](int i) { return fs::path(l.source) / l.shards[i]; };
  // 0: a symlink to a copy outside that only its owner may read.
  fs::rename(path(0), l.outside + "/secret.tar");
  fs::permissions(l.outside + "/secret.tar", fs::perms::owner_read | fs::perms::owner_write);
  fs::create_symlink(l.outside + "/secret.tar", path(0));
  // 1: a symlink to the same bytes elsewhere beneath the source.
  fs::rename(path(1), l.source + "/moved/1.tar");
  fs::create_symlink(fs::relative(l.source + "/moved/1.tar", path(1).parent_path()), path(1));
  // 2: through a symlinked directory that lies outside.
  fs::rename(path(2), l.outside + "/dir/2.tar");
  fs::create_symlink(l.outside + "/dir", l.source + "/linkdir");
  fs::create_symlink(fs::relative(l.source + "/linkdir/2.tar", path(2).parent_path()), path(2));
  // 3: a relative symlink whose ".." climbs out of the source.
  fs::rename(path(3), l.outside + "/3.tar");
  fs::create_symlink(fs::relative(l.outside + "/3.tar", path(3).parent_path()), path(3));
  return l;
}

class SourcePaths : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { layout_ = MakeLayout("source_paths"); }
  void TearDown() override { RemoveTree(layout_.dir); }
  std::vector<std::string> ResolveFlag(const char* name) const {
    if (GetParam().empty()) return {};
    return {absl::StrCat(name, GetParam())};
  }
  Layout layout_;
};

TEST_P(SourcePaths, TheDaemonNeverReadsThroughASymlinkOutOfTheSource) {
  ASSERT_EQ(layout_.shards.size(), 8u);
  ClusterOptions o{.dir = layout_.dir,
                   .job_config = JobConfigText(layout_.index, 1),
                   .source = layout_.source,
                   .nodes = 1,
                   .stager_flags = ResolveFlag("--path_resolve=")};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Daemon& stager = (*cluster)->stager(0);
  std::vector<std::unique_ptr<Client>> ranks;
  for (int r = 0; r < 2; ++r) {
    ClientOptions co = RankOptions(stager.address(), (*cluster)->packer().address(), r, 4);
    co.connect_timeout = absl::Seconds(10);
    auto c = Client::Connect(co);
    ASSERT_TRUE(c.ok()) << c.status();
    ranks.push_back(std::move(*c));
  }
  int outside = 0;
  for (int step = 0; step < 8; ++step) {
    for (auto& rank : ranks) {
      auto batch = rank->Next();
      ASSERT_TRUE(batch.ok()) << "step " << step << ": " << batch.status() << "\n"
                              << Tail(stager.log());
      for (const v1::SkippedSample& s : batch->skipped()) {
        EXPECT_EQ(s.reason(), "outside_root") << s.DebugString();
        EXPECT_THAT(s.detail(), HasSubstr("resolves outside " + layout_.source)) << s.detail();
        ++outside;
      }
      EXPECT_TRUE(batch->Release().ok());
    }
  }
  EXPECT_GT(outside, 0);
  // Nothing from outside reached the cache; the shard linked beneath did,
  // and no cache file is readable by others.
  const std::string cache = layout_.dir + "/cache0";
  for (int i : {0, 2, 3}) EXPECT_FALSE(fs::exists(cache + "/" + layout_.shards[i])) << i;
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(cache + "/" + layout_.shards[1])));
  for (const auto& e : fs::recursive_directory_iterator(cache)) {
    if (!e.is_regular_file()) continue;
    EXPECT_EQ(e.status().permissions() & (fs::perms::others_all | fs::perms::group_write),
              fs::perms::none)
        << e.path();
  }
  auto metrics = HttpGet(stager.metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_GT(MetricValue(*metrics,
                        "tutti_stager_path_refusals_total{reason=\"outside\","
                        "root=\"source\"}")
                .value_or(0),
            0)
      << *metrics;
  // Members of the batches built ahead and of images encoded here for other
  // ranks' documents count too.
  EXPECT_GE(MetricValue(*metrics, "tutti_stager_skipped_samples_total{reason=\"outside_root\"}")
                .value_or(-1),
            outside);
  ranks.clear();
  EXPECT_TRUE((*cluster)->Stop().ok());
  const std::string log = stager.log();
  EXPECT_THAT(log, HasSubstr("refused to open a file outside its directory"));
  EXPECT_THAT(log, HasSubstr(GetParam() == "walk" ? "checked walk" : "openat2 RESOLVE_BENEATH"));
}

TEST_P(SourcePaths, StageCommandRefusesShardsOutsideAndCopiesTheRest) {
  ASSERT_EQ(layout_.shards.size(), 8u);
  const std::string cache = layout_.dir + "/warm";
  std::vector<std::string> argv = {TuttiCli(),
                                   "stage",
                                   "--index=" + layout_.index,
                                   "--cache=" + cache,
                                   "--source=" + layout_.source,
                                   "--quiet"};
  for (const std::string& f : ResolveFlag("--path-resolve=")) argv.push_back(f);
  RunResult r = RunCommand(argv, absl::Seconds(120));
  EXPECT_EQ(r.status, 1) << r.output;
  for (int i : {0, 2, 3}) {
    EXPECT_THAT(r.output, HasSubstr(layout_.shards[i] + "' resolves outside " + layout_.source))
        << r.output;
    EXPECT_FALSE(fs::exists(cache + "/" + layout_.shards[i])) << i;
  }
  EXPECT_THAT(r.output, HasSubstr("staged 5 of 8 shards"));
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(cache + "/" + layout_.shards[1])));
}

// Shard files are opened beneath the --source directory the daemon opened at
// start: a source replaced (or remounted) under it is reported by /readyz
// instead of being read through the old handle unnoticed.
TEST(SourceReplaced, ReadinessSaysTheSourceIsAnotherDirectory) {
  Layout l = MakeLayout("source_replaced");
  ASSERT_EQ(l.shards.size(), 8u);
  auto cluster = Cluster::Start({.dir = l.dir,
                                 .job_config = JobConfigText(l.index, 1),
                                 .source = l.source,
                                 .nodes = 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Daemon& stager = (*cluster)->stager(0);
  auto readyz = [&] { return HttpGet(stager.metrics_port(), "/readyz"); };
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (absl::Now() < give_up && !readyz().ok()) absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(readyz().ok()) << readyz().status();
  fs::rename(l.source, l.source + ".old");
  fs::create_directories(l.source);
  absl::StatusOr<std::string> last;
  while (absl::Now() < give_up) {
    last = readyz();
    if (!last.ok() && last.status().message().find("another directory") != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_FALSE(last.ok());
  EXPECT_THAT(last.status().message(), HasSubstr("--source " + l.source));
  EXPECT_THAT(last.status().message(), HasSubstr("restart the daemon"));
  EXPECT_TRUE((*cluster)->Stop().ok());
  RemoveTree(l.dir);
}

INSTANTIATE_TEST_SUITE_P(Resolution, SourcePaths, ::testing::Values("", "walk"), [](const auto& i) {
  return i.param.empty() ? std::string("auto") : i.param;
});

}  // namespace
}  // namespace tutti::e2e
