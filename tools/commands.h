// The subcommands of the `tutti` tool. Each lives in its own tools/*_cmd.cc,
// registers itself with TUTTI_COMMAND, and parses its own options
// (tools/cli.h). argv[0] is the (last word of the) subcommand name.
#ifndef TUTTI_TOOLS_COMMANDS_H_
#define TUTTI_TOOLS_COMMANDS_H_

#include <vector>

namespace tutti::tools {

struct Command {
  const char* name;     // e.g. "gen-dataset", or "bench packer"
  const char* summary;  // one line for `tutti --help`
  int (*run)(int argc, char** argv);
};

// Every registered subcommand, sorted by name.
std::vector<Command>& Commands();

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* summary, int (*run)(int, char**)) {
    Commands().push_back(Command{name, summary, run});
  }
};

}  // namespace tutti::tools

#define TUTTI_COMMAND_CONCAT_INNER_(a, b) a##b
#define TUTTI_COMMAND_CONCAT_(a, b) TUTTI_COMMAND_CONCAT_INNER_(a, b)
// TUTTI_COMMAND("gen-dataset", "write a synthetic WebDataset", RunGenDataset);
#define TUTTI_COMMAND(name, summary, fn)                                                   \
  static ::tutti::tools::CommandRegistrar TUTTI_COMMAND_CONCAT_(tutti_command_, __LINE__)( \
      name, summary, fn)

#endif  // TUTTI_TOOLS_COMMANDS_H_
