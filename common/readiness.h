// Whether a daemon can do its job now, as /readyz and the gRPC health
// service report it. A daemon names the conditions it needs at start (the
// packer: its index loaded, its first plans computed; the stager: its cache
// usable, its source reachable, the packer answering), each with the reason
// it is not met yet, and sets them as they change. Ready = every condition
// met and not shutting down; otherwise the first unmet one says why.
// Transitions are logged.
//
// Thread-safe.
#ifndef TUTTI_COMMON_READINESS_H_
#define TUTTI_COMMON_READINESS_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace tutti {

class Readiness {
 public:
  // A condition the daemon needs, unmet (with `reason`) until Set.
  void Require(absl::string_view name, absl::string_view reason);
  // Met (OK) or not (why); an unknown name is added.
  void Set(absl::string_view name, const absl::Status& status);
  // From now on never ready (the daemon is stopping).
  void ShuttingDown();

  // OK when ready, else UNAVAILABLE "<condition>: <reason>".
  absl::Status Check() const;
  bool ready() const { return Check().ok(); }

  // Called with the new verdict whenever it flips, and once at once with the
  // current one, under the lock (so calls arrive in order). Null removes it.
  void Watch(std::function<void(bool ready)> watcher);

 private:
  struct Condition {
    std::string name;
    absl::Status status;
  };
  absl::Status CheckLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<Condition> conditions_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool reported_ ABSL_GUARDED_BY(mu_) = false;  // a verdict was logged
  bool last_ ABSL_GUARDED_BY(mu_) = false;      // the verdict last reported
  std::string last_reason_ ABSL_GUARDED_BY(mu_);
  std::function<void(bool)> watcher_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tutti

#endif  // TUTTI_COMMON_READINESS_H_
