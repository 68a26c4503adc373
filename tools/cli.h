// A small per-subcommand option parser for the `tutti` tool, so each
// subcommand's --help lists only its own options with their defaults.
#ifndef TUTTI_TOOLS_CLI_H_
#define TUTTI_TOOLS_CLI_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace tutti::tools {

class Cli {
 public:
  // usage: e.g. "tutti gen-dataset --out DIR [options]"; description: a paragraph.
  Cli(std::string usage, std::string description);

  void Flag(const std::string& name, std::string* value, const std::string& help);
  void Flag(const std::string& name, int64_t* value, const std::string& help);
  void Flag(const std::string& name, uint64_t* value, const std::string& help);
  void Flag(const std::string& name, uint32_t* value, const std::string& help);
  void Flag(const std::string& name, double* value, const std::string& help);
  void Flag(const std::string& name, bool* value, const std::string& help);
  // An integer flag with its range [lo, hi]: a value outside it is a usage
  // error naming the flag and the range (--help shows the range too).
  void Flag(const std::string& name, uint64_t* value, const std::string& help, uint64_t lo,
            uint64_t hi);
  void Flag(const std::string& name, uint32_t* value, const std::string& help, uint32_t lo,
            uint32_t hi);

  // Parses "--name=value", "--name value" and "--flag"/"--noflag" for bools.
  // Returns true to proceed; false when the caller should exit with *exit_code
  // (0 after --help, 2 after a usage error, which is printed to stderr).
  bool Parse(int argc, char** argv, int* exit_code);

  const std::vector<std::string>& positional() const { return positional_; }
  void PrintHelp() const;

 private:
  using Target = std::variant<std::string*, int64_t*, uint64_t*, uint32_t*, double*, bool*>;
  struct Option {
    std::string name;
    Target target;
    std::string help;
    std::string default_text;
    bool ranged = false;
    uint64_t lo = 0, hi = 0;
  };
  bool Set(Option& opt, const std::string& value, std::string* error);

  std::string usage_;
  std::string description_;
  std::vector<Option> options_;
  std::vector<std::string> positional_;
};

}  // namespace tutti::tools

#endif  // TUTTI_TOOLS_CLI_H_
