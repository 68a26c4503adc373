#include "common/daemon_flags.h"

#include <grp.h>

#include <cstdlib>
#include <mutex>
#include <iostream>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/internal/program_name.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/byte_size.h"
#include "common/process_metrics.h"

namespace tutti {
namespace {

std::string ProgramName(int argc, char** argv) {
  std::string program = argc > 0 ? argv[0] : "tutti";
  return program.substr(program.find_last_of('/') + 1);
}

bool IsOurs(absl::string_view file, const std::vector<std::string>& files) {
  for (const auto& f : files) {
    if (absl::EndsWith(file, f)) return true;
  }
  return false;
}

// Sets one flag from "--name[=value]" (and the next argument when the value
// is separate); returns the error, or "" when set.
std::string SetFlag(absl::string_view arg, int* i, int argc, char** argv) {
  absl::string_view body = arg;
  absl::ConsumePrefix(&body, "-");
  absl::ConsumePrefix(&body, "-");
  absl::string_view name = body, value;
  const size_t eq = body.find('=');
  const bool has_value = eq != absl::string_view::npos;
  if (has_value) {
    name = body.substr(0, eq);
    value = body.substr(eq + 1);
  }
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr && !has_value && absl::StartsWith(name, "no")) {
    absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
    if (negated != nullptr && negated->IsOfType<bool>()) {
      std::string error;
      return negated->ParseFrom("false", &error) ? "" : error;
    }
  }
  if (flag == nullptr || flag->IsRetired()) {
    return absl::StrCat("unknown flag --", name);
  }
  std::string owned;
  if (!has_value) {
    if (flag->IsOfType<bool>()) {
      value = "true";
    } else if (*i + 1 < argc) {
      owned = argv[++*i];
      value = owned;
    } else {
      return absl::StrCat("--", name, " needs a value");
    }
  }
  std::string error;
  if (!flag->ParseFrom(value, &error)) {
    return absl::StrCat("--", name, " '", value, "' is not valid: ", error);
  }
  return "";
}

}  // namespace

void ExitBadUsage(absl::string_view program, absl::string_view message) {
  std::cerr << program << ": " << message << " (see --help)" << std::endl;
  std::exit(kExitBadUsage);
}

void ParseDaemonFlags(int argc, char** argv, const std::string& usage,
                      const std::vector<std::string>& flag_files) {
  const std::string program = ProgramName(argc, argv);
  static std::once_flag usage_set;  // Abseil allows setting it once per process
  std::call_once(usage_set, [&] { absl::SetProgramUsageMessage(usage); });
  absl::FlagsUsageConfig config;
  // --help lists the daemon's own flags under the program's name rather than
  // the source files' paths, not those of the libraries it links.
  config.contains_help_flags = [program](absl::string_view f) { return f == program; };
  config.contains_helpshort_flags = config.contains_help_flags;
  config.version_string = [] {
    return absl::StrCat("tutti ", BuildVersion(), " (commit ", BuildCommit(),
                        ", wire contract tutti.v1)\n");
  };
  config.normalize_filename = [flag_files, program](absl::string_view f) {
    return IsOurs(f, flag_files) ? program : std::string(f);
  };
  absl::SetFlagsUsageConfig(config);
  absl::flags_internal::SetProgramInvocationName(argv[0]);
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--") break;
    if (a == "--help" || a == "-help" || a == "-h" || a == "--helpshort" || a == "-helpshort" ||
        a == "--helpfull") {
      absl::flags_internal::FlagsHelp(std::cout, a == "--helpfull" ? "" : program,
                                      absl::flags_internal::HelpFormat::kHumanReadable, usage);
      std::cout.flush();
      std::exit(kExitOk);
    }
    if (a == "--version" || a == "-version") {
      std::cout << program << ": " << config.version_string();
      std::cout.flush();
      std::exit(kExitOk);
    }
  }
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--") {
      if (i + 1 < argc) ExitBadUsage(program, absl::StrCat("unexpected argument '", argv[i + 1], "'"));
      break;
    }
    if (!absl::StartsWith(a, "-") || a == "-") {
      ExitBadUsage(program, absl::StrCat("unexpected argument '", a, "'; flags start with --"));
    }
    const std::string error = SetFlag(a, &i, argc, argv);
    if (!error.empty()) ExitBadUsage(program, error);
  }
}

absl::Status CheckFlagRange(absl::string_view flag, uint64_t value, uint64_t lo, uint64_t hi,
                            absl::string_view meaning) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, " ", value, " is out of range: use ", lo, "..", hi,
      meaning.empty() ? "" : absl::StrCat(" (", meaning, ")")));
}

absl::StatusOr<uint64_t> ByteSizeFlag(absl::string_view flag, absl::string_view text,
                                      uint64_t lo, uint64_t hi, absl::string_view zero_means) {
  const std::string range = absl::StrCat(
      FormatBytes(lo), " to ", FormatBytes(hi),
      zero_means.empty() ? "" : absl::StrCat(", or 0 = ", zero_means));
  uint64_t v = 0;
  if (!ParseByteSize(text, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " '", text, "' is not a size like 64K, 1M or 500G (use ", range, ")"));
  }
  if (v == 0 && !zero_means.empty()) return v;
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", text, " is out of range: use ", range));
  }
  return v;
}

absl::Status CheckAddressFlag(absl::string_view flag, absl::string_view text, AddressUse use,
                              bool unix_socket) {
  const uint32_t lo = use == AddressUse::kServe ? 0 : 1;
  const std::string forms = absl::StrCat(
      "use HOST:PORT or [IPV6]:PORT with PORT ", lo, "..65535",
      use == AddressUse::kServe ? " (0 = any free port)" : "",
      unix_socket ? ", or unix:///PATH" : "");
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " '", text, "' ", why, ": ", forms));
  };
  if (absl::StartsWith(text, "unix:")) {
    if (!unix_socket) return bad("cannot be a Unix socket");
    absl::string_view path = text.substr(5);
    absl::ConsumePrefix(&path, "//");
    if (path.empty() || path == "/") return bad("names no socket path");
    return absl::OkStatus();
  }
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos) return bad("has no port");
  absl::string_view host = text.substr(0, colon);
  const absl::string_view port = text.substr(colon + 1);
  if (absl::ConsumePrefix(&host, "[") && !absl::ConsumeSuffix(&host, "]")) {
    return bad("has an unclosed [");
  }
  if (host.empty()) return bad("has no host (0.0.0.0 or [::] serve on every address)");
  if (host.find(':') != absl::string_view::npos && text.front() != '[') {
    return bad("needs brackets around an IPv6 host");
  }
  uint32_t value = 0;
  if (port.empty() || port.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(port, &value)) {
    return bad("has no numeric port");
  }
  if (value < lo || value > 65535) return bad("has a port out of range");
  return absl::OkStatus();
}

absl::StatusOr<int> GroupFlag(absl::string_view flag, const std::string& text) {
  uint32_t gid = 0;
  if (absl::SimpleAtoi(text, &gid)) {
    if (gid > 0x7fffffff) return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", text, " is out of range"));
    return static_cast<int>(gid);  // a number need not be in /etc/group (a container's GID)
  }
  std::vector<char> buf(16384);
  group g;
  group* found = nullptr;
  if (::getgrnam_r(text.c_str(), &g, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " '", text, "' is no group on this host; give a group name or a numeric GID"));
  }
  return static_cast<int>(found->gr_gid);
}

}  // namespace tutti
