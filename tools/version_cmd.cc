#include <cstdio>

#include "tools/commands.h"

namespace {
int RunVersion(int, char**) {
  std::printf("tutti 0.1.0 (wire contract tutti.v1)\n");
  return 0;
}
}  // namespace

TUTTI_COMMAND("version", "print the version and wire-contract revision", RunVersion);
