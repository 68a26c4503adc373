// Command-line parsing for tutti's executables: `--help` lists the flags the
// program itself defines (those in its own source file), with their defaults.
#ifndef TUTTI_COMMON_DAEMON_FLAGS_H_
#define TUTTI_COMMON_DAEMON_FLAGS_H_

#include <vector>

namespace tutti {

// Sets the usage message, limits --help to flags defined in source files whose
// path ends with `flags_file` (e.g. "services/stager/main.cc"), and parses.
// Returns the positional arguments, as absl::ParseCommandLine does.
std::vector<char*> ParseFlags(int argc, char** argv, const char* usage, const char* flags_file);

}  // namespace tutti

#endif  // TUTTI_COMMON_DAEMON_FLAGS_H_
