#include "client/retry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tutti {

RetryClock RetryClock::Real() {
  return RetryClock{[] { return absl::Now(); }, [](absl::Duration d) { absl::SleepFor(d); }};
}

absl::Status RetryUnavailable(const RetryPolicy& policy, absl::string_view what,
                              const std::function<absl::Status()>& attempt, const RetryClock& clock,
                              int* attempts) {
  const absl::Time start = clock.now();
  absl::Duration backoff = policy.initial_backoff;
  for (int n = 1;; ++n) {
    absl::Status s = attempt();
    if (attempts != nullptr) *attempts = n;
    if (!absl::IsUnavailable(s)) return s;
    const absl::Duration spent = clock.now() - start;
    if (spent + backoff > policy.budget) {
      return absl::UnavailableError(absl::StrCat(what, ": gave up after ", n, " attempts over ",
                                                 absl::FormatDuration(spent), ": ", s.message()));
    }
    clock.sleep(backoff);
    backoff = std::min(policy.max_backoff, backoff * 2);
  }
}

}  // namespace tutti
