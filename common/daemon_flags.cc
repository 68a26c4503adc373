#include "common/daemon_flags.h"

#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

namespace tutti {

std::vector<char*> ParseFlags(int argc, char** argv, const char* usage, const char* flags_file) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  const std::string file = flags_file;
  config.contains_help_flags = [file](absl::string_view f) { return absl::EndsWith(f, file); };
  config.contains_helpshort_flags = config.contains_help_flags;
  config.version_string = [] { return std::string("tutti 0.1.0 (wire contract tutti.v1)\n"); };
  absl::SetFlagsUsageConfig(config);
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace tutti
