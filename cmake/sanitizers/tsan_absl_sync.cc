// ThreadSanitizer builds only (TUTTI_SANITIZE=thread): makes abseil's
// synchronisation visible to TSan when libabsl_synchronization itself is not
// built with -fsanitize=thread (Debian's is not).
//
// An uninstrumented absl::Mutex orders nothing in TSan's eyes: two accesses,
// both under one mutex, are reported as a race. Every program of the TSan
// build links this file, which defines the entry points of absl::Mutex,
// absl::CondVar, absl::Notification, absl::BlockingCounter and absl::Barrier
// itself. A definition in the executable takes precedence over the shared
// library's for every caller (our code, libgrpc, libabsl itself: all call
// through the PLT); each one tells TSan what the operation does with the
// public annotation interface, the same annotations abseil makes when it is
// built with TSan, and forwards to the library's implementation
// (dlsym(RTLD_NEXT)).
//
// The library's implementation runs inside the annotation (between pre_ and
// post_), where TSan ignores memory accesses: a Condition abseil evaluates
// while it locks or unlocks is not checked for races (the accesses abseil
// guards are, before and after).
//
// absl::Status: copies share a reference-counted representation, and the
// library's UnrefNonInlined drops a reference with an atomic TSan does not
// see; the copy that drops the last one frees it. Every drop releases, the
// last one acquires first (a reference count as TSan models one).
//
// Entry points call one another (LockWhenWithTimeout calls
// LockWhenWithDeadline, Notification::WaitForNotification calls LockWhen and
// Unlock, each through the PLT); only the outermost one on a thread is
// annotated.
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/base/config.h"
#include "absl/status/status.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cmake/sanitizers/tsan_real.h"

#if !defined(ABSL_LTS_RELEASE_VERSION) || ABSL_LTS_RELEASE_VERSION != 20220623
// The entry points and how they call one another are those of this release.
#error "tsan_absl_sync.cc is written for abseil LTS 20220623: check the entry points it wraps"
#endif

namespace {

// "_ZN4absl" and abseil's inline namespace, e.g. "_ZN4absl7debian3": the
// start of the mangled name of a member of an absl class.
std::string Absl() {
  std::string name = "_ZN4absl";
#if ABSL_OPTION_USE_INLINE_NAMESPACE
  const char* ns = ABSL_INTERNAL_TOKEN_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  name += std::to_string(std::strlen(ns)) + ns;
#endif
  return name;
}
// The same for a const member function.
std::string AbslConst() { return "_ZNK" + Absl().substr(3); }

// Depth of entry points on this thread: only the outermost one annotates.
thread_local int depth = 0;

class Nested {
 public:
  Nested() : outer_(depth++ == 0) {}
  ~Nested() { --depth; }
  bool outer() const { return outer_; }

 private:
  const bool outer_;
};

using absl::Condition;
using absl::Duration;
using absl::Time;
using tutti_tsan::Real;

Real<void (*)(absl::Mutex*)> real_lock(Absl, "5Mutex4LockEv");
Real<void (*)(absl::Mutex*)> real_unlock(Absl, "5Mutex6UnlockEv");
Real<bool (*)(absl::Mutex*)> real_try_lock(Absl, "5Mutex7TryLockEv");
Real<void (*)(absl::Mutex*)> real_reader_lock(Absl, "5Mutex10ReaderLockEv");
Real<void (*)(absl::Mutex*)> real_reader_unlock(Absl, "5Mutex12ReaderUnlockEv");
Real<bool (*)(absl::Mutex*)> real_reader_try_lock(Absl, "5Mutex13ReaderTryLockEv");
Real<void (*)(absl::Mutex*, const Condition&)> real_lock_when(Absl,
                                                              "5Mutex8LockWhenERKNS0_9ConditionE");
Real<bool (*)(absl::Mutex*, const Condition&, Duration)> real_lock_when_timeout(
    Absl, "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
Real<bool (*)(absl::Mutex*, const Condition&, Time)> real_lock_when_deadline(
    Absl, "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
Real<void (*)(absl::Mutex*, const Condition&)> real_reader_lock_when(
    Absl, "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
Real<bool (*)(absl::Mutex*, const Condition&, Duration)> real_reader_lock_when_timeout(
    Absl, "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
Real<bool (*)(absl::Mutex*, const Condition&, Time)> real_reader_lock_when_deadline(
    Absl, "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
Real<void (*)(absl::Mutex*, const Condition&)> real_await(Absl, "5Mutex5AwaitERKNS0_9ConditionE");
Real<bool (*)(absl::Mutex*, const Condition&, Duration)> real_await_timeout(
    Absl, "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
Real<bool (*)(absl::Mutex*, const Condition&, Time)> real_await_deadline(
    Absl, "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
Real<void (*)(absl::Mutex*)> real_mutex_dtor(Absl, "5MutexD2Ev");
Real<void (*)(absl::CondVar*, absl::Mutex*)> real_cv_wait(Absl, "7CondVar4WaitEPNS0_5MutexE");
Real<bool (*)(absl::CondVar*, absl::Mutex*, Duration)> real_cv_wait_timeout(
    Absl, "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
Real<bool (*)(absl::CondVar*, absl::Mutex*, Time)> real_cv_wait_deadline(
    Absl, "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
Real<void (*)(absl::Notification*)> real_notify(Absl, "12Notification6NotifyEv");
Real<void (*)(const absl::Notification*)> real_wait_notification(
    AbslConst, "12Notification19WaitForNotificationEv");
Real<bool (*)(const absl::Notification*, Duration)> real_wait_notification_timeout(
    AbslConst, "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
Real<bool (*)(const absl::Notification*, Time)> real_wait_notification_deadline(
    AbslConst, "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
Real<bool (*)(absl::BlockingCounter*)> real_decrement_count(Absl,
                                                            "15BlockingCounter14DecrementCountEv");
Real<void (*)(absl::BlockingCounter*)> real_counter_wait(Absl, "15BlockingCounter4WaitEv");
Real<bool (*)(absl::Barrier*)> real_barrier_block(Absl, "7Barrier5BlockEv");
Real<void (*)(uintptr_t)> real_status_unref(Absl, "6Status15UnrefNonInlinedEm");

constexpr unsigned kRead = __tsan_mutex_read_lock;

// Lock operations: `how` runs the library's implementation between the
// annotations; it returns whether the mutex is held afterwards.
template <typename F>
bool Acquire(absl::Mutex* mu, unsigned flags, F how) {
  Nested nested;
  if (!nested.outer()) return how();
  __tsan_mutex_pre_lock(mu, flags);
  const bool held = how();
  __tsan_mutex_post_lock(mu, held ? flags : flags | __tsan_mutex_try_lock_failed, 0);
  return held;
}

template <typename F>
void Release(absl::Mutex* mu, unsigned flags, F how) {
  Nested nested;
  if (!nested.outer()) return how();
  __tsan_mutex_pre_unlock(mu, flags);
  how();
  __tsan_mutex_post_unlock(mu, flags);
}

// Waits that release the (write-held) mutex and hold it again on return,
// whatever the wait's outcome.
template <typename F>
auto WaitHolding(absl::Mutex* mu, F how) {
  Nested nested;
  if (!nested.outer()) return how();
  __tsan_mutex_pre_unlock(mu, 0);
  const auto result = how();
  __tsan_mutex_post_unlock(mu, 0);
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
  return result;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Acquire(this, 0, [&] {
    real_lock.get()(this);
    return true;
  });
}

void Mutex::Unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Release(this, 0, [&] { real_unlock.get()(this); });
}

bool Mutex::TryLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return Acquire(this, __tsan_mutex_try_lock, [&] { return real_try_lock.get()(this); });
}

void Mutex::ReaderLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Acquire(this, kRead, [&] {
    real_reader_lock.get()(this);
    return true;
  });
}

void Mutex::ReaderUnlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Release(this, kRead, [&] { real_reader_unlock.get()(this); });
}

bool Mutex::ReaderTryLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return Acquire(this, kRead | __tsan_mutex_try_lock,
                 [&] { return real_reader_try_lock.get()(this); });
}

// The *When* forms hold the mutex on return whether or not the condition
// became true in time.
void Mutex::LockWhen(const Condition& cond) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Acquire(this, 0, [&] {
    real_lock_when.get()(this, cond);
    return true;
  });
}

bool Mutex::LockWhenWithTimeout(const Condition& cond,
                                absl::Duration timeout) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  bool became_true = false;
  Acquire(this, 0, [&] {
    became_true = real_lock_when_timeout.get()(this, cond, timeout);
    return true;
  });
  return became_true;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond,
                                 absl::Time deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  bool became_true = false;
  Acquire(this, 0, [&] {
    became_true = real_lock_when_deadline.get()(this, cond, deadline);
    return true;
  });
  return became_true;
}

void Mutex::ReaderLockWhen(const Condition& cond) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Acquire(this, kRead, [&] {
    real_reader_lock_when.get()(this, cond);
    return true;
  });
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond,
                                      absl::Duration timeout) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  bool became_true = false;
  Acquire(this, kRead, [&] {
    became_true = real_reader_lock_when_timeout.get()(this, cond, timeout);
    return true;
  });
  return became_true;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond,
                                       absl::Time deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  bool became_true = false;
  Acquire(this, kRead, [&] {
    became_true = real_reader_lock_when_deadline.get()(this, cond, deadline);
    return true;
  });
  return became_true;
}

void Mutex::Await(const Condition& cond) {
  WaitHolding(this, [&] {
    real_await.get()(this, cond);
    return true;
  });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  return WaitHolding(this, [&] { return real_await_timeout.get()(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  return WaitHolding(this, [&] { return real_await_deadline.get()(this, cond, deadline); });
}

Mutex::~Mutex() {
  __tsan_mutex_destroy(this, __tsan_mutex_not_static);
  real_mutex_dtor.get()(this);
}

void CondVar::Wait(Mutex* mu) {
  WaitHolding(mu, [&] {
    real_cv_wait.get()(this, mu);
    return true;
  });
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  return WaitHolding(mu, [&] { return real_cv_wait_timeout.get()(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  return WaitHolding(mu, [&] { return real_cv_wait_deadline.get()(this, mu, deadline); });
}

// Notification: Notify releases at the flag's address, every wait that sees it
// notified acquires there (the library's fast path reads the flag where TSan
// does not see it). HasBeenNotified is inline: compiled with TSan, its
// acquiring load of the flag synchronises with that release.
void Notification::Notify() {
  __tsan_release(&notified_yet_);
  Nested nested;
  real_notify.get()(this);
}

void Notification::WaitForNotification() const {
  {
    Nested nested;
    real_wait_notification.get()(this);
  }
  __tsan_acquire(const_cast<std::atomic<bool>*>(&notified_yet_));
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  bool notified;
  {
    Nested nested;
    notified = real_wait_notification_timeout.get()(this, timeout);
  }
  if (notified) __tsan_acquire(const_cast<std::atomic<bool>*>(&notified_yet_));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  bool notified;
  {
    Nested nested;
    notified = real_wait_notification_deadline.get()(this, deadline);
  }
  if (notified) __tsan_acquire(const_cast<std::atomic<bool>*>(&notified_yet_));
  return notified;
}

// BlockingCounter and Barrier: every thread's work before DecrementCount or
// Block happens before Wait or Block returns.
bool BlockingCounter::DecrementCount() {
  __tsan_release(this);
  Nested nested;
  return real_decrement_count.get()(this);
}

void BlockingCounter::Wait() {
  {
    Nested nested;
    real_counter_wait.get()(this);
  }
  __tsan_acquire(this);
}

bool Barrier::Block() {
  __tsan_release(this);
  bool last;
  {
    Nested nested;
    last = real_barrier_block.get()(this);
  }
  __tsan_acquire(this);
  return last;
}

void Status::UnrefNonInlined(uintptr_t rep) {
  status_internal::StatusRep* r = RepToPointer(rep);
  // Read before the release, so that the release orders the read too: the
  // last holder frees the representation.
  const bool last = r->ref.load(std::memory_order_acquire) == 1;
  __tsan_release(r);
  if (last) __tsan_acquire(r);
  real_status_unref.get()(rep);
}

ABSL_NAMESPACE_END
}  // namespace absl
