#!/usr/bin/env bash
# Runs the whole test suite (unit and integration tests) with CTest.
#   tools/test.sh            all tests
#   tools/test.sh -R Packer  only tests matching a regex (any ctest flag works)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
cmake --build "$BUILD_DIR" -j"$(nproc)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)" "$@"
