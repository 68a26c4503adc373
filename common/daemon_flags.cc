#include "common/daemon_flags.h"

#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/flags/internal/program_name.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

namespace tutti {

std::vector<char*> ParseFlags(int argc, char** argv, const char* usage, const char* flags_file) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  const std::string file = flags_file;
  std::string program = argc > 0 ? argv[0] : "tutti";
  program = program.substr(program.find_last_of('/') + 1);
  // --help lists the daemon's own flags (under the program's name rather
  // than the source file's path), not those of the libraries it links.
  config.contains_help_flags = [program](absl::string_view f) { return f == program; };
  config.contains_helpshort_flags = config.contains_help_flags;
  config.version_string = [] { return std::string("tutti 0.1.0 (wire contract tutti.v1)\n"); };
  config.normalize_filename = [file, program](absl::string_view f) {
    return absl::EndsWith(f, file) ? program : std::string(f);
  };
  absl::SetFlagsUsageConfig(config);
  // Plain --help (or -h) prints the usage and this program's flags and
  // exits 0; the other help flags (--helpfull, --help=TEXT) stay as Abseil
  // has them.
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--") break;
    if (a == "--help" || a == "-help" || a == "-h" || a == "--helpshort" || a == "-helpshort") {
      absl::flags_internal::SetProgramInvocationName(argv[0]);
      absl::flags_internal::FlagsHelp(std::cout, program,
                                      absl::flags_internal::HelpFormat::kHumanReadable, usage);
      std::cout.flush();
      std::exit(0);
    }
  }
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace tutti
