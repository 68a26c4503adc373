#include "common/readiness.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace tutti {
namespace {
const Logger kLog("daemon.readiness");
}  // namespace

void Readiness::Require(absl::string_view name, absl::string_view reason) {
  absl::MutexLock l(&mu_);
  for (auto& c : conditions_) {
    if (c.name == name) return;
  }
  conditions_.push_back({std::string(name), absl::UnavailableError(reason)});
  Changed();
}

void Readiness::Set(absl::string_view name, const absl::Status& status) {
  absl::MutexLock l(&mu_);
  bool found = false;
  for (auto& c : conditions_) {
    if (c.name == name) {
      c.status = status;
      found = true;
    }
  }
  if (!found) conditions_.push_back({std::string(name), status});
  Changed();
}

void Readiness::ShuttingDown() {
  absl::MutexLock l(&mu_);
  shutting_down_ = true;
  Changed();
}

absl::Status Readiness::CheckLocked() const {
  if (shutting_down_) return absl::UnavailableError("shutting down");
  for (const auto& c : conditions_) {
    if (!c.status.ok()) return absl::UnavailableError(absl::StrCat(c.name, ": ", c.status.message()));
  }
  return absl::OkStatus();
}

absl::Status Readiness::Check() const {
  absl::MutexLock l(&mu_);
  return CheckLocked();
}

void Readiness::Changed() {
  const absl::Status now = CheckLocked();
  const std::string reason(now.message());
  if (reported_ && now.ok() == last_ && reason == last_reason_) return;
  if (!reported_ || now.ok() != last_) {
    if (now.ok()) {
      kLog.Info("ready");
    } else {
      kLog.Info("not ready", {{"reason", reason}});
    }
    if (watcher_ && reported_) watcher_(now.ok());
  } else if (!now.ok()) {
    kLog.Info("still not ready", {{"reason", reason}});
  }
  reported_ = true;
  last_ = now.ok();
  last_reason_ = reason;
}

void Readiness::Watch(std::function<void(bool)> watcher) {
  absl::MutexLock l(&mu_);
  watcher_ = std::move(watcher);
  if (watcher_) watcher_(CheckLocked().ok());
}

}  // namespace tutti
