// ThreadSanitizer builds only (TUTTI_SANITIZE=thread): the runtime options
// and suppressions every program of the tree runs with, compiled in so that
// ctest, mpirun and the daemons need no environment. TSAN_OPTIONS still
// overrides.
extern "C" {

const char* __tsan_default_options() {
  // Both stacks of a lock-order inversion, not only the one closing it.
  return "second_deadlock_stack=1";
}

// Libraries from Debian, not built with TSan, whose own accesses TSan does
// not see and whose lock-free handoffs (atomics, reference counts) it cannot
// see either: what they do through an interceptor (memcpy, recvmsg, free)
// would be judged against orderings it cannot see. `called_from_lib` leaves
// just the interceptors called from that library unchecked; every access of
// our code (including memcpy and free it calls) is still checked, and the
// library's locks still order (tsan_absl_sync.cc makes abseil's visible).
// One library per entry: a template matching two loaded libraries is an
// error.
const char* __tsan_default_suppressions() {
  return
      // gRPC's core and its C++ layer: messages, slices and channel state
      // handed between its threads through its own atomics and closures.
      "called_from_lib:libgrpc.so\n"
      "called_from_lib:libgrpc++.so\n"
      "called_from_lib:libgpr.so\n"
      // absl::Status and absl::Cord: shared representations freed by the
      // thread that drops the last reference (an atomic decrement inside
      // the library).
      "called_from_lib:libabsl_status.so\n"
      "called_from_lib:libabsl_cord.so\n"
      // abseil's deadlock-detection graph (absl::Mutex's debug cycle
      // checker): guarded by a spin lock inside the library that
      // tsan_absl_sync.cc does not reach; gRPC's mutexes enter it when they
      // are destroyed on different threads.
      "called_from_lib:libabsl_graphcycles_internal.so\n"
      // abseil's pool of random generators (absl::BitGen, which gRPC draws
      // from on every call): entries allocated by the first thread to use
      // one and shared behind a spin lock inside the library.
      "called_from_lib:libabsl_random_internal_pool_urbg.so\n"
      // gRPC's C++ call ops and callback tags, compiled into our binaries
      // from its headers: a batch filled on the thread that starts a write
      // (FillOps) is finished on a gRPC thread (FinalizeResult), a tag set
      // on one thread is run on another, each handed over through the
      // completion queue inside libgrpc, which TSan does not see. Only a
      // report whose innermost frame is that gRPC function is left out
      // (race_top), so our callbacks' own accesses are still checked.
      "race_top:grpc::internal::CallOpSet<*>::FinalizeResult\n"
      "race_top:grpc::internal::CallbackWithSuccessTag::Run\n"
      // abseil's time zone cache: its lock is created on first use behind a
      // function-local static whose fast path TSan does not see.
      "called_from_lib:libabsl_time_zone.so\n"
      // OpenSSL (gRPC's TLS): records decrypted into gRPC's buffers on the
      // thread that reads the socket, handed on through gRPC's own atomics.
      "called_from_lib:libssl.so\n"
      // OpenSSL's libcrypto: its own locks, freed by the thread that drops
      // the last reference to the object holding them (its own atomics).
      "called_from_lib:libcrypto.so\n"
      // GDAL (loaded by OpenCV's image codecs) takes two of its own mutexes
      // in both orders on one thread (CPLCreateOrAcquireMutexEx,
      // CPLAcquireMutex): a lock order inside GDAL, every frame its own.
      "deadlock:libgdal.so\n"
      // Open MPI's TCP transport (a component it loads) takes its own
      // endpoint and process locks in both orders when it adds and removes
      // peers (mca_btl_tcp_add_procs, mca_btl_tcp_del_procs).
      "deadlock:mca_btl_tcp.so\n";
}

}  // extern "C"
