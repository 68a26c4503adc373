// AddressSanitizer / UndefinedBehaviorSanitizer builds only
// (TUTTI_SANITIZE=address): the runtime options every program of the tree
// runs with, compiled in so that ctest, mpirun and the daemons need no
// environment. ASAN_OPTIONS, UBSAN_OPTIONS and LSAN_OPTIONS still override.
#include <cstdlib>

extern "C" {

const char* __asan_default_options() {
  return "detect_leaks=1:strict_string_checks=1:check_initialization_order=1";
}

// Open MPI unloads its components at MPI_Finalize: what they keep is then
// reported from an unknown module that no suppression can name. Ranks under
// mpirun are checked for everything but leaks (asked at exit, when the
// environment is readable); every other program for leaks too.
int __lsan_is_turned_off() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

const char* __ubsan_default_options() { return "print_stacktrace=1:halt_on_error=1"; }

// Allocations third-party libraries keep for the life of the process (or of
// a thread) and never free: not tutti's leaks. Every other leak fails the
// program.
const char* __lsan_default_suppressions() {
  return
      // Open MPI and what it loads (a singleton MPI_Init outside mpirun).
      "leak:libmpi.so\n"
      "leak:libopen-pal.so\n"
      "leak:libopen-rte.so\n"
      "leak:libpmix.so\n"
      "leak:libhwloc.so\n"
      "leak:libevent\n"
      // GLPK's per-thread environment (glp_init_env), freed only by
      // glp_free_env on that thread.
      "leak:glp_init_env\n"
      // libfuse's argument list in tutti-slowfs (the test file system).
      "leak:fuse_opt_add_arg\n";
}

}  // extern "C"
