// A training client as an unprivileged process: drops to --uid and --gid,
// with --groups as its only supplementary groups (as a Kubernetes pod's
// runAsUser / runAsGroup / supplementalGroups), then takes the first batch
// of --rank from the stager through libtutti and reads every byte of it.
// Prints "ok step=S bytes=N segment_mode=M segment_gid=G"; exit 0 on
// success, 1 with the error otherwise. Run by stager_integration_test as root.
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "tutti/v1/stager.pb.h"

ABSL_FLAG(uint32_t, uid, 65534, "user to run as");
ABSL_FLAG(uint32_t, gid, 65534, "primary group to run as");
ABSL_FLAG(std::string, groups, "", "supplementary groups, comma-separated GIDs");
ABSL_FLAG(std::string, stager, "", "stager address (unix:///PATH)");
ABSL_FLAG(std::string, packer, "", "packer address");
ABSL_FLAG(int, rank, 0, "rank");
ABSL_FLAG(int, world_size, 4, "ranks in the job");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<gid_t> groups;
  for (absl::string_view g : absl::StrSplit(absl::GetFlag(FLAGS_groups), ',', absl::SkipEmpty())) {
    uint32_t v = 0;
    if (absl::SimpleAtoi(g, &v)) groups.push_back(v);
  }
  if (::setgroups(groups.size(), groups.data()) != 0 || ::setgid(absl::GetFlag(FLAGS_gid)) != 0 ||
      ::setuid(absl::GetFlag(FLAGS_uid)) != 0) {
    std::perror("dropping privileges");
    return 1;
  }
  tutti::ClientOptions o;
  o.stager_address = absl::GetFlag(FLAGS_stager);
  o.packer_address = absl::GetFlag(FLAGS_packer);
  o.rank = absl::GetFlag(FLAGS_rank);
  o.world_size = absl::GetFlag(FLAGS_world_size);
  o.start_step = 0;
  o.connect_timeout = absl::Seconds(5);
  o.batch_timeout = absl::Seconds(60);
  o.retry_budget = absl::Seconds(5);
  auto client = tutti::Client::Connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  auto batch = (*client)->Next();
  if (!batch.ok()) {
    std::fprintf(stderr, "next: %s\n", std::string(batch.status().message()).c_str());
    return 1;
  }
  uint64_t bytes = 0, sum = 0;
  for (const tutti::ArrayView& a : batch->arrays()) {
    const auto* p = static_cast<const unsigned char*>(a.data);
    for (size_t i = 0; i < a.nbytes; ++i) sum += p[i];
    bytes += a.nbytes;
  }
  struct stat st{};
  const std::string path = "/dev/shm" + batch->descriptor().shm_name();
  ::stat(path.c_str(), &st);
  std::printf("ok step=%llu bytes=%llu sum=%llu segment_mode=%o segment_gid=%u\n",
              static_cast<unsigned long long>(batch->step()),
              static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(sum),
              st.st_mode & 07777, st.st_gid);
  return bytes > 0 ? 0 : 1;
}
