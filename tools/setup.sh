#!/usr/bin/env bash
# Sets up tutti on a Debian 12 machine: installs the packages it builds with
# (idempotent), configures and builds it, then runs the quick-start.
#
#   tools/setup.sh                 install, build, run the quick-start
#   tools/setup.sh --no-quickstart install and build only
#   BUILD_DIR=out tools/setup.sh   build somewhere else (default: build/)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
RUN_QUICKSTART=1
for arg in "$@"; do
  case "$arg" in
    --no-quickstart) RUN_QUICKSTART=0 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libopencv-dev libjpeg62-turbo-dev libpng-dev libwebp-dev liburing-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin
  pybind11-dev python3-dev python3-numpy
  prometheus libglpk-dev glpk-utils libfuse3-dev fuse3 fio curl
  python3-torch python3-pil python3-mpi4py clang libclang-rt-14-dev openssl
  slurm-wlm python3-yaml python3-kubernetes python3-seccomp
  python3-sentencepiece python3-jinja2 nlohmann-json3-dev libsimdjson-dev python3-matplotlib
)
# kubectl (for the deploy tests' `kubectl kustomize`): Debian's kubernetes-client,
# unless a kubectl from another package is already installed.
if ! command -v kubectl >/dev/null 2>&1; then PACKAGES+=(kubernetes-client); fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "==> installing ${#missing[@]} Debian packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "==> all ${#PACKAGES[@]} Debian packages already installed"
fi

echo "==> configuring in $BUILD_DIR"
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null
echo "==> building (ccache: $(command -v ccache >/dev/null && echo on || echo off))"
cmake --build "$BUILD_DIR" -j"$(nproc)"

if ((RUN_QUICKSTART)); then
  echo "==> quick-start"
  "$ROOT/tools/quickstart.sh"
fi
