#include "common/daemon.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/daemon_flags.h"
#include "common/log.h"
#include "common/log_grpc.h"

ABSL_FLAG(std::string, log_format, "text",
          "log line format: 'text' (<time> <LEVEL> <component> <message> key=value ...) or "
          "'json' (one object per line)");
ABSL_FLAG(std::string, log_level, "info",
          "lowest level logged: 'debug', 'info', 'warning' or 'error'");

namespace tutti {
namespace {

const Logger kLog("daemon");

enum class Phase : int { kStarting, kServing, kStopping };

constexpr absl::Duration kStartupGrace = absl::Seconds(5);
// Signals this soon after the first are the same request arriving twice
// (a terminal's Ctrl-C reaches the whole process group, and the script that
// started the daemon passes it on; srun signals each task, then scancel
// does): they are ignored. A later one is someone who will not wait.
constexpr absl::Duration kRepeatWindow = absl::Seconds(3);

// SIGTERM and SIGINT stop the daemon; SIGHUP (a closed terminal, an
// operator's "reload") is logged and ignored: the logs go to stderr, so
// there is nothing to reopen, and it must never end a daemon.
sigset_t WatchedSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  return set;
}

// Waits up to `tick` for a watched signal: a stop signal, or -1 (none, or a
// SIGHUP, which is logged here).
int WaitForStopSignal(const sigset_t& sigs, const timespec& tick) {
  const int sig = sigtimedwait(&sigs, nullptr, &tick);
  if (sig != SIGHUP) return sig;
  kLog.Info(
      "SIGHUP received and ignored: the logs go to stderr, there is nothing to reopen; "
      "SIGTERM or SIGINT stops the daemon",
      {{"signal", sig}});
  return -1;
}

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kStarting:
      return "starting";
    case Phase::kServing:
      return "serving";
    case Phase::kStopping:
      return "shutting down";
  }
  return "?";
}

}  // namespace

int RunDaemon(int argc, char** argv, const DaemonMain& main) {
  const std::string usage = absl::StrCat(
      main.usage, "\nSIGTERM or SIGINT stops it within ", absl::FormatDuration(kStopBound),
      " at any moment (also while starting), exit 0; SIGHUP is logged and ignored."
      "\nExit status: 0 clean exit, 1 runtime failure, 2 bad usage (an unknown flag, a bad or "
      "out-of-range value)."
      "\n    --help (this text; --helpfull: every flag, those of the libraries too)"
      "\n    --version (the version and the source commit)");
  std::vector<std::string> files = main.flag_files;
  files.push_back("common/daemon.cc");
  ParseDaemonFlags(argc, argv, usage, files);
  LogOptions log;
  auto format = ParseLogFormat(absl::GetFlag(FLAGS_log_format));
  if (!format.ok())
    ExitBadUsage(main.name, absl::StrCat("--log_format: ", format.status().message()));
  auto level = ParseLogLevel(absl::GetFlag(FLAGS_log_level));
  if (!level.ok()) ExitBadUsage(main.name, absl::StrCat("--log_level: ", level.status().message()));
  log.format = *format;
  log.min_level = *level;
  ConfigureLogging(log);
  RouteGrpcLogging();
  ::signal(SIGPIPE, SIG_IGN);
#ifdef NDEBUG
  // Debian's abseil looks for lock-order cycles on every Mutex acquisition
  // (its debug default), a few percent of a busy daemon's CPU. Release builds
  // rely on the compile-time thread-safety analysis instead.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif

  // Taken by the watcher below; blocked before any other thread exists, so
  // every thread inherits the mask.
  const sigset_t sigs = WatchedSignals();
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  StopSignal stop;
  std::atomic<Phase> phase{Phase::kStarting};
  absl::Notification finished;
  std::thread watcher([&] {
    const timespec tick{0, 100 * 1000 * 1000};
    int sig = -1;
    while (!finished.HasBeenNotified() && sig <= 0) sig = WaitForStopSignal(sigs, tick);
    if (sig <= 0) return;  // the daemon ended by itself
    kLog.Info("signal received, stopping", {{"signal", sig}, {"phase", PhaseName(phase.load())}});
    stop.Request();
    // While starting nothing is held yet, so a step that cannot be
    // interrupted (loading an index from a hung file system) is given
    // less time than a shutdown.
    const absl::Time signalled = absl::Now();
    auto give_up = [&] {
      return signalled +
             (phase.load() == Phase::kStarting ? kStartupGrace : kStopBound - absl::Seconds(1));
    };
    while (!finished.HasBeenNotified() && absl::Now() < give_up()) {
      const int again = WaitForStopSignal(sigs, tick);
      if (again <= 0) continue;
      if (absl::Now() - signalled < kRepeatWindow) {
        kLog.Info("signal received again; already stopping", {{"signal", again}});
        continue;
      }
      kLog.Error("second signal: exiting at once", {{"signal", again}});
      std::_Exit(kExitFailure);
    }
    if (finished.HasBeenNotified()) return;
    const Phase p = phase.load();
    if (p == Phase::kStarting) {
      // A start-up step that cannot be interrupted (a hung file system):
      // nothing is held yet, so leaving now is clean.
      kLog.Info("start-up did not stop in time; exiting",
                {{"bound", absl::FormatDuration(kStopBound)}});
      std::_Exit(kExitOk);
    }
    kLog.Error("shutdown did not finish in time; exiting",
               {{"bound", absl::FormatDuration(kStopBound)}, {"phase", PhaseName(p)}});
    std::_Exit(kExitFailure);
  });
  auto finish = [&](int code) {
    finished.Notify();
    watcher.join();
    return code;
  };

  absl::StatusOr<std::unique_ptr<Daemon>> daemon = main.make();
  if (!daemon.ok()) {
    if (absl::IsInvalidArgument(daemon.status())) {
      finish(kExitBadUsage);
      ExitBadUsage(main.name, daemon.status().message());
    }
    kLog.Error(daemon.status().message());
    return finish(kExitFailure);
  }
  const absl::Status started = (*daemon)->Start(stop);
  if (stop.requested()) {
    phase = Phase::kStopping;
    (*daemon)->Shutdown();
    kLog.Info("stopped", {{"while", "starting"}});
    return finish(kExitOk);
  }
  if (!started.ok()) {
    kLog.Error(started.message());
    phase = Phase::kStopping;
    (*daemon)->Shutdown();
    return finish(kExitFailure);
  }
  phase = Phase::kServing;
  // The banner line for people and scripts reading stdout, once: with text
  // logs on stdout, the "serving" line says no more (stdout and stderr often
  // end in one place: a terminal, journald, kubectl logs); with JSON logs
  // every line of output is an object, and the "serving" line carries it.
  if (log.format == LogFormat::kText) {
    std::cout << (*daemon)->Banner() << std::endl;
    kLog.Info("serving");
  } else {
    kLog.Info("serving", {{"banner", (*daemon)->Banner()}});
  }
  stop.Wait();
  phase = Phase::kStopping;
  (*daemon)->Shutdown();
  kLog.Info("stopped");
  return finish(kExitOk);
}

}  // namespace tutti
