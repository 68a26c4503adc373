// ThreadSanitizer builds only (TUTTI_SANITIZE=thread): makes the reference
// count by which grpc::Server waits for its calls at shutdown visible to TSan
// (Debian's libgrpc++ is not built with it).
//
// Every call the server handles holds a reference; Shutdown drops its own
// and waits until the last call has dropped one. The drops are an atomic
// decrement inside libgrpc++ that TSan does not see, so what a call did
// before it finished (its last reads of the server, in gRPC's inline code)
// looked unordered with the server's destruction after Shutdown returned.
// Every program of the TSan build defines the two functions itself (every
// caller reaches them through the PLT): each drop releases, and the shutdown
// wait acquires once it returns; both forward to libgrpc++.
#include <sanitizer/tsan_interface.h>

#include "cmake/sanitizers/tsan_real.h"
#include "grpcpp/server.h"
#include "grpcpp/version_info.h"

#if GRPC_CPP_VERSION_MAJOR != 1 || GRPC_CPP_VERSION_MINOR != 51
// The functions wrapped, and that libgrpc++ calls them through the PLT, are
// those of this release.
#error "tsan_grpc.cc is written for gRPC 1.51: check the functions it wraps"
#endif

namespace {

tutti_tsan::Real<void (*)(grpc::Server*)> real_unref(nullptr,
                                                     "_ZN4grpc6Server23UnrefWithPossibleNotifyEv");
tutti_tsan::Real<void (*)(grpc::Server*)> real_unref_and_wait(
    nullptr, "_ZN4grpc6Server18UnrefAndWaitLockedEv");

}  // namespace

namespace grpc {

void Server::UnrefWithPossibleNotify() {
  __tsan_release(this);
  real_unref.get()(this);
}

void Server::UnrefAndWaitLocked() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  __tsan_release(this);
  real_unref_and_wait.get()(this);
  __tsan_acquire(this);
}

}  // namespace grpc
