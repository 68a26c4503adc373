// The lifecycle every tutti daemon shares; each main() is one call:
//
//   int main(int argc, char** argv) { return tutti::RunDaemon(argc, argv, StagerDaemonMain()); }
//
// RunDaemon parses the flags (bad usage exits 2), configures logging
// (--log_format, --log_level; gRPC's own lines routed through common/log.h),
// takes SIGTERM and SIGINT on a thread of its own from before any other
// thread starts, builds the daemon from its flags (DaemonMain::make; an
// INVALID_ARGUMENT there is bad usage), starts it, prints its banner, serves
// until a signal, and shuts it down. A signal at any moment, during start-up
// too (loading an index, waiting for a peer), ends the process within
// kStopBound with exit 0: the daemon's waits watch the StopSignal, and a
// start-up step that cannot be interrupted (a hung file system) is
// abandoned when the bound runs out, since nothing is held yet. A shutdown
// that itself overruns the bound exits 1 naming that. The same signal
// arriving again within 3 s (a process group's Ctrl-C passed on by the
// script that started the daemon) changes nothing; a signal after that ends
// the process at once (exit 1).
//
// Exit status: 0 clean exit (also after SIGTERM/SIGINT), 1 runtime failure,
// 2 bad usage.
#ifndef TUTTI_COMMON_DAEMON_H_
#define TUTTI_COMMON_DAEMON_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/stop_signal.h"

namespace tutti {

// How long a daemon may take to end after SIGTERM / SIGINT.
inline constexpr absl::Duration kStopBound = absl::Seconds(10);

// A daemon's own part (StagerServer, PackerServer).
class Daemon {
 public:
  virtual ~Daemon() = default;
  // Starts serving. May wait (for a peer, an index) but returns soon after
  // `stop` is requested (any status: the stop is what counts then).
  virtual absl::Status Start(const StopSignal& stop) = 0;
  // Finishes or hands back in-flight work and releases what it holds
  // (segments, ports) well within kStopBound. Idempotent.
  virtual void Shutdown() = 0;
  // One line once serving: "tutti-stagerd node 0 listening on ... (metrics ...)".
  virtual std::string Banner() const = 0;
};

struct DaemonMain {
  std::string name;                     // "tutti-stagerd"
  std::string usage;                    // the first lines of --help
  std::vector<std::string> flag_files;  // sources whose flags --help lists
  // Builds the daemon from its flags. INVALID_ARGUMENT: bad usage (exit 2).
  std::function<absl::StatusOr<std::unique_ptr<Daemon>>()> make;
};

int RunDaemon(int argc, char** argv, const DaemonMain& main);

}  // namespace tutti

#endif  // TUTTI_COMMON_DAEMON_H_
