#include "services/stager/window/rank_processes.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/security_options.h"

namespace tutti::stager {
namespace {

void KernelRandom(void* out, size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  while (n > 0) {
    const ssize_t got = ::getrandom(p, n, 0);
    if (got > 0) {
      p += got;
      n -= static_cast<size_t>(got);
    } else if (got < 0 && errno != EINTR) {
      // No getrandom(2) (a seccomp profile refusing it): the C++ library's
      // device (/dev/urandom).
      std::random_device rd;
      for (; n > 0; --n) *p++ = static_cast<unsigned char>(rd());
    }
  }
}

// Compares in time independent of where they differ.
bool SameKey(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

RankProcesses::RankProcesses(Random random)
    : random_(random ? std::move(random) : Random(KernelRandom)) {
  random_(&first_, sizeof(first_));
  first_ = (first_ >> 1) | 1;
}

ProcessKey RankProcesses::Register(uint32_t rank, uint64_t* replaced) {
  ProcessKey p;
  p.incarnation = first_ + issued_++;
  p.key.resize(kKeyBytes);
  random_(p.key.data(), p.key.size());
  ProcessKey& current = current_[rank];
  *replaced = current.incarnation;
  current = p;
  return p;
}

uint64_t RankProcesses::Current(uint32_t rank) const {
  auto it = current_.find(rank);
  return it == current_.end() ? 0 : it->second.incarnation;
}

absl::Status RankProcesses::Check(uint32_t rank, const ProcessKey& caller) const {
  auto it = current_.find(rank);
  if (caller.incarnation == 0) {
    if (it == current_.end()) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        "rank ", rank, " is served to the process that registered for it (incarnation ",
        absl::Hex(it->second.incarnation),
        "); a call naming no incarnation may not act for it (a rank's process registers with "
        "RegisterRank and names the incarnation and key issued to it, as libtutti does)"));
  }
  if (it != current_.end() && it->second.incarnation == caller.incarnation) {
    if (SameKey(caller.key, it->second.key)) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        "the key sent with incarnation ", absl::Hex(caller.incarnation), " of rank ", rank,
        " is not the one issued with it: only the process that registered may act with it"));
  }
  if (Issued(caller.incarnation) && it == current_.end()) {
    return absl::PermissionDeniedError(absl::StrCat("incarnation ", absl::Hex(caller.incarnation),
                                                    " was not issued to a process of rank ", rank));
  }
  if (Issued(caller.incarnation)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " is now served to a newer process (incarnation ", absl::Hex(Current(rank)),
        "); this one (", absl::Hex(caller.incarnation), ") was replaced and must stop"));
  }
  return absl::NotFoundError(absl::StrCat(
      "incarnation ", absl::Hex(caller.incarnation), " of rank ", rank, " ", kUnknownIncarnation,
      " (it restarted since the process registered, or the incarnation is made up): a rank's "
      "process registers (RegisterRank) and names the incarnation and key issued to it"));
}

}  // namespace tutti::stager
