// `tutti`: the command line for datasets, indexes, plans and benchmarks.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "tools/commands.h"

namespace tutti::tools {
std::vector<Command>& Commands() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace tutti::tools

int main(int argc, char** argv) {
  auto& commands = tutti::tools::Commands();
  std::sort(commands.begin(), commands.end(),
            [](const auto& a, const auto& b) { return std::strcmp(a.name, b.name) < 0; });
  auto usage = [&] {
    std::printf("usage: tutti <command> [options]   (tutti <command> --help for its options;\n"
                "       tutti --version)\n\n"
                "tutti feeds vision-language training jobs: it stages and decodes data on every\n"
                "node and plans balanced steps for every rank.\n\ncommands:\n");
    for (const auto& c : commands) std::printf("  %-18s %s\n", c.name, c.summary);
  };
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  // --version as every tutti binary takes it: the `version` command.
  if (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "-version")) {
    argv[1] = const_cast<char*>("version");
  }
  // Two-word commands ("bench packer") match before one-word ones.
  for (int words = 2; words >= 1; --words) {
    if (argc < 1 + words) continue;
    std::string name = argv[1];
    if (words == 2) name += std::string(" ") + argv[2];
    for (const auto& c : commands) {
      if (name == c.name) return c.run(argc - words, argv + words);
    }
  }
  std::fprintf(stderr, "tutti: unknown command '%s'\n\n", argv[1]);
  usage();
  return 2;
}
