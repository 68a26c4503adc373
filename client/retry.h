// Retrying RPCs while a daemon restarts: UNAVAILABLE is retried with capped
// exponential backoff until a time budget is spent; every other result is
// returned at once. The clock is injected so the policy is tested without
// waiting.
#ifndef TUTTI_CLIENT_RETRY_H_
#define TUTTI_CLIENT_RETRY_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tutti {

struct RetryPolicy {
  absl::Duration budget = absl::Seconds(120);  // total time spent retrying
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);  // backoff doubles up to this
};

struct RetryClock {
  std::function<absl::Time()> now;
  std::function<void(absl::Duration)> sleep;
  static RetryClock Real();
};

// Calls `attempt` until it returns anything but UNAVAILABLE, or until the
// next backoff would end past the budget; then returns the last UNAVAILABLE
// prefixed with "<what>: gave up after N attempts over D". *attempts (if
// given) receives the number of calls.
absl::Status RetryUnavailable(const RetryPolicy& policy, absl::string_view what,
                              const std::function<absl::Status()>& attempt,
                              const RetryClock& clock = RetryClock::Real(),
                              int* attempts = nullptr);

}  // namespace tutti

#endif  // TUTTI_CLIENT_RETRY_H_
