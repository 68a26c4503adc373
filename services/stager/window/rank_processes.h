// Which process serves each of this node's ranks, and how its calls prove
// it. A rank's process registers (RegisterRank): the stager issues it an
// incarnation (an id, logged) and a key (random bytes only that process is
// told, never logged), and every later call of that process names both. A
// new registration for a rank makes the caller the rank's process; the one
// it replaces must stop. A call is checked before it changes anything:
//   - the rank's current incarnation and its key: the rank's process;
//   - that incarnation with another key: PERMISSION_DENIED;
//   - an incarnation this stager issued and since replaced: FAILED_PRECONDITION
//     (that process must stop); one issued for another rank while this one
//     has none: PERMISSION_DENIED;
//   - one it never issued (it restarted since, or it is made up): NOT_FOUND,
//     with kUnknownIncarnation in the message (register again);
//   - no incarnation (0): only for a rank no process registered for since the
//     stager started (a client that names none); else PERMISSION_DENIED.
// Incarnations are issued in sequence from a random start, so an issued one
// is told from an invented one without keeping the replaced ones.
//
// The binding is the key: whoever may call the stager (the socket's group, or
// the job's token) may register for a rank, which is how a restarted rank
// takes over, but no one renews, releases or asks under another process's
// incarnation.
//
// Not thread-safe: StagerCore keeps it under its lock.
#ifndef TUTTI_SERVICES_STAGER_WINDOW_RANK_PROCESSES_H_
#define TUTTI_SERVICES_STAGER_WINDOW_RANK_PROCESSES_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tutti::stager {

// What a call says about the process it comes from.
struct ProcessKey {
  uint64_t incarnation = 0;  // 0: none named
  std::string key;
};

class RankProcesses {
 public:
  static constexpr size_t kKeyBytes = 16;
  // Fills `n` bytes at `out` with unpredictable ones.
  using Random = std::function<void(void* out, size_t n)>;

  // random: null = the kernel's (getrandom(2)).
  explicit RankProcesses(Random random = nullptr);

  // A new process for `rank`: its incarnation and key. *replaced: the
  // incarnation it replaces (0: none).
  ProcessKey Register(uint32_t rank, uint64_t* replaced);
  // OK when a call naming `caller` may act for `rank` (see above).
  absl::Status Check(uint32_t rank, const ProcessKey& caller) const;
  // The rank's registered incarnation (0: none).
  uint64_t Current(uint32_t rank) const;

 private:
  bool Issued(uint64_t incarnation) const { return incarnation - first_ < issued_; }

  Random random_;
  uint64_t first_ = 0;   // the first incarnation issued (odd, below 2^63: never 0)
  uint64_t issued_ = 0;  // how many were
  std::map<uint32_t, ProcessKey> current_;  // rank -> its process
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_WINDOW_RANK_PROCESSES_H_
