// Command-line parsing for tutti's daemons, strict about bad usage: an
// unknown flag, a missing or malformed value, or a stray argument prints
// "<program>: <what is wrong> (see --help)" and exits 2. `--help` (-h)
// lists the daemon's own flags (those defined in its flag files) under the
// program's name with their defaults and exits 0; `--helpfull` lists every
// flag; `--version` prints the version and commit. Flags take --name=value,
// --name value, and --name / --noname for booleans.
//
// Numeric flags are range-checked after parsing with the helpers below,
// whose errors name the flag, the value and the accepted range.
#ifndef TUTTI_COMMON_DAEMON_FLAGS_H_
#define TUTTI_COMMON_DAEMON_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tutti {

// Exit codes of every tutti daemon.
inline constexpr int kExitOk = 0;          // a clean exit, also after SIGTERM / SIGINT
inline constexpr int kExitFailure = 1;     // a runtime failure
inline constexpr int kExitBadUsage = 2;    // an unknown flag, a bad or out-of-range value

// Sets the flags from argv or exits (see above). `flag_files`: suffixes of
// the source files whose flags --help lists (e.g. "services/stager/stagerd_flags.cc").
void ParseDaemonFlags(int argc, char** argv, const std::string& usage,
                      const std::vector<std::string>& flag_files);

// Prints "<program>: <message> (see --help)" to stderr and exits 2.
[[noreturn]] void ExitBadUsage(absl::string_view program, absl::string_view message);

// OK when lo <= value <= hi; else INVALID_ARGUMENT
// "--<flag> <value> is out of range: use <lo>..<hi>[ (<meaning>)]".
absl::Status CheckFlagRange(absl::string_view flag, uint64_t value, uint64_t lo, uint64_t hi,
                            absl::string_view meaning = "");
// A byte size ("64K", "1M", "500G") within [lo, hi], or exactly 0 when
// zero_means is not empty (its meaning is named in the range message).
absl::StatusOr<uint64_t> ByteSizeFlag(absl::string_view flag, absl::string_view text,
                                      uint64_t lo, uint64_t hi,
                                      absl::string_view zero_means = "");

// What an address flag names: one to serve on (port 0 = any free port) or
// one to connect to (port 1..65535).
enum class AddressUse { kServe, kConnect };
// OK for HOST:PORT or [V6]:PORT with a non-empty HOST and a decimal PORT in
// range, or, when `unix_socket`, unix:PATH / unix:///PATH with a path; else
// INVALID_ARGUMENT naming the flag and the forms it takes.
absl::Status CheckAddressFlag(absl::string_view flag, absl::string_view text, AddressUse use,
                              bool unix_socket);

// A group given by name or number ("tutti", "10001"); INVALID_ARGUMENT
// naming the flag when no such group exists.
absl::StatusOr<int> GroupFlag(absl::string_view flag, const std::string& text);

}  // namespace tutti

#endif  // TUTTI_COMMON_DAEMON_FLAGS_H_
