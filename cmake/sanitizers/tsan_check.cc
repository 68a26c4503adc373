// ThreadSanitizer builds only: checks that TSan sees abseil's synchronisation
// (tsan_absl_sync.cc) and still sees races. `tutti-tsan-check <case>` runs
// one case on two threads; CTest expects the ordered cases to run clean and
// the racy ones to be reported.
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/synchronization/barrier.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

// Plain ints, no atomics: TSan sees every access. `volatile` keeps the
// compiler from merging or dropping them.
volatile int value = 0;
bool ready = false;

void Write() { value = value + 1; }

// Both threads write `value` under one absl::Mutex: ordered.
void MutexOrders() {
  absl::Mutex mu;
  std::thread t([&] {
    absl::MutexLock l(&mu);
    Write();
  });
  {
    absl::MutexLock l(&mu);
    Write();
  }
  t.join();
}

// Reader and writer locks on one mutex: ordered.
void ReaderLockOrders() {
  absl::Mutex mu;
  int seen = 0;
  std::thread t([&] {
    absl::ReaderMutexLock l(&mu);
    seen = value;
  });
  {
    absl::WriterMutexLock l(&mu);
    Write();
  }
  t.join();
  std::printf("seen %d\n", seen);
}

// A write before Unlock is seen after LockWhen's condition holds; the write
// itself is not under the mutex.
void LockWhenOrders() {
  absl::Mutex mu;
  std::thread t([&] {
    mu.LockWhen(absl::Condition(&ready));
    Write();
    mu.Unlock();
  });
  Write();
  {
    absl::MutexLock l(&mu);
    ready = true;
  }
  t.join();
}

// Await and a CondVar wait release and take the mutex again.
void AwaitAndCondVarOrder() {
  absl::Mutex mu;
  absl::CondVar cv;
  bool second = false;
  std::thread t([&] {
    absl::MutexLock l(&mu);
    mu.Await(absl::Condition(&ready));
    Write();
    second = true;
    cv.Signal();
  });
  {
    absl::MutexLock l(&mu);
    Write();
    ready = true;
    while (!second) cv.WaitWithTimeout(&mu, absl::Seconds(1));
    Write();
  }
  t.join();
}

// TryLock that succeeds orders; the loop retries until it does.
void TryLockOrders() {
  absl::Mutex mu;
  std::thread t([&] {
    while (!mu.TryLock()) std::this_thread::yield();
    Write();
    mu.Unlock();
  });
  {
    absl::MutexLock l(&mu);
    Write();
  }
  t.join();
}

// Notification: the waiter may find it notified without taking the mutex.
void NotificationOrders() {
  absl::Notification n;
  std::thread t([&] {
    Write();
    n.Notify();
  });
  while (!n.HasBeenNotified()) std::this_thread::yield();
  Write();
  t.join();
  absl::Notification m;
  std::thread u([&] {
    Write();
    m.Notify();
  });
  m.WaitForNotificationWithTimeout(absl::Seconds(60));
  Write();
  u.join();
}

void CounterAndBarrierOrder() {
  absl::BlockingCounter counter(1);
  std::thread t([&] {
    Write();
    counter.DecrementCount();
  });
  counter.Wait();
  Write();
  t.join();
  auto* barrier = new absl::Barrier(2);
  int before = 0;
  std::thread u([&] {
    before = 1;
    if (barrier->Block()) delete barrier;
  });
  if (barrier->Block()) delete barrier;
  std::printf("before %d\n", before);
  u.join();
}

// Races TSan must still report.
void UnprotectedRaces() {
  std::thread t(Write);
  Write();
  t.join();
}

// Each thread holds a different mutex: nothing orders the writes.
void TwoMutexesRace() {
  absl::Mutex a, b;
  std::thread t([&] {
    absl::MutexLock l(&a);
    Write();
  });
  {
    absl::MutexLock l(&b);
    Write();
  }
  t.join();
}

// A copy our code makes (through TSan's memcpy interceptor) races with a
// write on another thread.
void MemcpyRaces() {
  static char buffer[64];
  static volatile size_t size = sizeof(buffer);  // not inlined: a call
  std::thread t([] { std::memset(buffer, 1, size); });
  char copy[64];
  std::memcpy(copy, buffer, size);
  t.join();
  std::printf("copy %d\n", copy[0]);
}

// A write after the waiter's check is not ordered by the notification.
void WriteAfterNotifyRaces() {
  absl::Notification n;
  std::thread t([&] {
    n.Notify();
    Write();
  });
  n.WaitForNotification();
  Write();
  t.join();
}

struct Case {
  const char* name;
  void (*run)();
};

constexpr Case kCases[] = {
    {"mutex", MutexOrders},
    {"reader_lock", ReaderLockOrders},
    {"lock_when", LockWhenOrders},
    {"await_condvar", AwaitAndCondVarOrder},
    {"try_lock", TryLockOrders},
    {"notification", NotificationOrders},
    {"counter_barrier", CounterAndBarrierOrder},
    {"race_unprotected", UnprotectedRaces},
    {"race_two_mutexes", TwoMutexesRace},
    {"race_after_notify", WriteAfterNotifyRaces},
    {"race_memcpy", MemcpyRaces},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2) {
    for (const Case& c : kCases) {
      if (std::strcmp(argv[1], c.name) == 0) {
        c.run();
        std::printf("%s: done\n", c.name);
        return 0;
      }
    }
  }
  std::fprintf(stderr, "usage: %s <case>; cases:", argv[0]);
  for (const Case& c : kCases) std::fprintf(stderr, " %s", c.name);
  std::fprintf(stderr, "\n");
  return 2;
}
