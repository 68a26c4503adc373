// A request to stop (SIGTERM, SIGINT) that every wait during a daemon's
// start-up and serving also waits on, so a stop is seen at once wherever
// the daemon is.
//
// Thread-safe.
#ifndef TUTTI_COMMON_STOP_SIGNAL_H_
#define TUTTI_COMMON_STOP_SIGNAL_H_

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace tutti {

class StopSignal {
 public:
  void Request() {
    if (!requested_.exchange(true)) stop_.Notify();
  }
  bool requested() const { return stop_.HasBeenNotified(); }
  // Sleeps for `d` unless a stop is requested first; true when it was.
  bool SleepFor(absl::Duration d) const { return stop_.WaitForNotificationWithTimeout(d); }
  void Wait() const { stop_.WaitForNotification(); }

 private:
  std::atomic<bool> requested_{false};
  absl::Notification stop_;
};

}  // namespace tutti

#endif  // TUTTI_COMMON_STOP_SIGNAL_H_
