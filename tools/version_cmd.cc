#include <cstdio>

#include "common/process_metrics.h"
#include "tools/commands.h"

namespace {
// The line every tutti binary prints for --version (common/daemon_flags.cc).
int RunVersion(int, char**) {
  std::printf("tutti %s (commit %s, wire contract tutti.v1)\n",
              tutti::BuildVersion().c_str(), tutti::BuildCommit().c_str());
  return 0;
}
}  // namespace

TUTTI_COMMAND("version", "print the version, the source commit and the wire contract",
              RunVersion);
