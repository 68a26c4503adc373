#!/usr/bin/env bash
# Installs a built tree into a fresh prefix with `cmake --install`, then
# builds and runs the consumer project against it with find_package(tutti).
#   tests/install_consumer/run.sh <build-dir> <work-dir> [cmake args for the consumer...]
set -euo pipefail
BUILD_DIR="$1"
WORK="$2"
shift 2
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf "$WORK"
mkdir -p "$WORK"
cmake --install "$BUILD_DIR" --prefix "$WORK/prefix" >"$WORK/install.log"
for f in lib/libtutti.so include/tutti/client/client.h lib/cmake/tutti/tuttiConfig.cmake; do
  [ -e "$WORK/prefix/$f" ] || { echo "cmake --install did not install $f" >&2; exit 1; }
done
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$HERE" -B "$WORK/build" -G Ninja -DCMAKE_PREFIX_PATH="$WORK/prefix" "${launcher[@]}" "$@"
cmake --build "$WORK/build"
"$WORK/build/tutti-consumer"
rm -rf "$WORK"
