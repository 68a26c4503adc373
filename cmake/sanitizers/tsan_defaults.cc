// ThreadSanitizer builds only (TUTTI_SANITIZE=thread): the runtime options
// every program of the tree runs with, compiled in so that ctest, mpirun and
// the daemons need no environment. TSAN_OPTIONS still overrides.
extern "C" {

const char* __tsan_default_options() {
  // Both stacks of a lock-order inversion, not only the one that closes it.
  return "second_deadlock_stack=1";
}

}  // extern "C"
