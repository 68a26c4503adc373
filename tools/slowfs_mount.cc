#include "tools/slowfs_mount.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace tutti::tools {
namespace {

namespace fs = std::filesystem;

bool Mounted(const std::string& mnt) {
  std::ifstream m("/proc/mounts");
  std::string line;
  while (std::getline(m, line)) {
    if (line.find(" " + mnt + " ") != std::string::npos) return true;
  }
  return false;
}

}  // namespace

std::string SlowfsBinary(const std::string& given) {
  if (!given.empty()) return given;
  const fs::path self = fs::read_symlink("/proc/self/exe");
  for (auto p :
       {self.parent_path() / "slowfs" / "tutti-slowfs", self.parent_path() / "tutti-slowfs"}) {
    if (fs::exists(p)) return p.string();
  }
  return "tutti-slowfs";
}

SlowfsMount::SlowfsMount(const std::string& bin, const std::string& src, const std::string& mnt,
                         double latency_ms, std::vector<std::string> stalls)
    : mnt_(mnt) {
  // A mount left by an interrupted run ("transport endpoint is not connected") goes first.
  std::system(
      absl::StrCat("fusermount3 -u -q '", mnt, "' 2>/dev/null || umount -l '", mnt, "' 2>/dev/null")
          .c_str());
  std::error_code ec;
  fs::create_directories(mnt, ec);
  pid_ = ::fork();
  if (pid_ == 0) {
    std::vector<std::string> args = {"tutti-slowfs", src, mnt,
                                     absl::StrCat("--latency_ms=", latency_ms)};
    for (const auto& s : stalls) args.push_back("--stall=" + s);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::freopen("/dev/null", "w", stdout);  // keep --json output clean
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  for (int i = 0; i < 200 && !mounted_; ++i) {
    ::usleep(20000);
    mounted_ = Mounted(mnt);
  }
  if (!mounted_) {
    std::fprintf(stderr, "tutti bench: could not mount %s with %s (no FUSE?)\n", mnt.c_str(),
                 bin.c_str());
  }
}

SlowfsMount::~SlowfsMount() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }
  std::system(absl::StrCat("fusermount3 -u -q '", mnt_, "' 2>/dev/null").c_str());
}

}  // namespace tutti::tools
