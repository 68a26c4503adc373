#!/usr/bin/env bash
# Runs the whole test suite (unit and integration tests) with CTest.
#   tools/test.sh            all tests
#   tools/test.sh -R Packer  only tests matching a regex (any ctest flag works)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
cmake --build "$BUILD_DIR" -j"$(nproc)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# What the tests write to temporary storage (GoogleTest's TEST_TMPDIR; TMPDIR for Python,
# torchrun, Open MPI and the daemons) goes to one directory of this run, removed when the run
# ends, passed or not (the tests remove what they make too). Mode 1777 like /tmp: the
# unprivileged-client tests reach sockets in it as another user. TUTTI_KEEP_TEST_TMP=1 keeps
# it and prints where it is.
TEST_ROOT="$(mktemp -d "${TMPDIR:-/tmp}/tutti-tests.XXXXXX")"
chmod 1777 "$TEST_ROOT"
finish() {
  if [[ "${TUTTI_KEEP_TEST_TMP:-0}" == 1 ]]; then
    echo "tools/test.sh: the tests' temporary files are in $TEST_ROOT"
  else
    rm -rf --one-file-system "$TEST_ROOT" 2>/dev/null || true
  fi
}
trap finish EXIT
export TEST_TMPDIR="$TEST_ROOT" TMPDIR="$TEST_ROOT"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)" "$@"
