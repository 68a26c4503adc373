#!/usr/bin/env bash
# The checks that need a GPU machine (NVIDIA GPUs, CUDA, NCCL; PyTorch for the
# Python part), in under five minutes:
#   1. configure with CUDA (-DTUTTI_WITH_CUDA=ON) and build the NCCL transport,
#      the post-balancing exchange test and the Python module;
#   2. the post-balancing exchange test over NCCL: 100 planned steps, load,
#      forward and backward exchanges with device buffers, every byte checked,
#      and each encoder's exchange straight from its output with one
#      ncclSend/ncclRecv pair per peer and direction, counted (plan_version 4:
#      every pair one contiguous run; tests/post_exchange_mpi_test.cc
#      --transport=nccl, one rank per GPU);
#   3. with one GPU, two ranks on it: NCCL refuses a duplicate GPU, and the
#      test must fail at once saying so, not hang;
#   4. tools/gpu_check.py: tutti.NcclTransport with torch CUDA tensors (one
#      ncclSend per peer, each encoder's output as its send buffer, a
#      plan_version 3 plan refused, the errors for host buffers and wrong
#      sizes), NCCL throughput, and a ViT forward timing fitted to the cost
#      model a*p + b*p^2;
#   5. the example trainer (client/python/examples/train_vlm.py) on one rank
#      per GPU under torchrun with NCCL (batches moved to the GPU, the exchange
#      over the trainer's NCCL group: one uneven all_to_all_single, a split
#      per pair, its output placed through batch.image_embed_index), against a
#      packer and a stager started here on a generated dataset: 10 steps, the
#      loss must fall.
# The output goes to the terminal and, dated, to tools/gpu_check.out (kept in
# the repository beside this script). CI does not run it. Needs what
# tools/setup.sh installs, plus the CUDA toolkit with NCCL (CUDAToolkit_ROOT,
# default /usr/local/cuda) and an NVIDIA driver.
#
#   tools/gpu_check.sh                  # BUILD=build-gpu JOBS=$(nproc)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=tools/gpu_check.out
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
START=$(date +%s)
exec > >(tee "$OUT") 2>&1

failures=0
step() { echo; echo "== $* ($(($(date +%s) - START)) s)"; }
result() {  # result NAME RC
  if [ "$2" -eq 0 ]; then echo "PASS $1"; else echo "FAIL $1 (exit $2)"; failures=$((failures + 1)); fi
}

echo "tutti gpu_check, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader || {
  echo "FAIL no NVIDIA GPU or driver (nvidia-smi)"; exit 1; }
GPUS=$(nvidia-smi -L | wc -l)

step "configure with CUDA and NCCL"
mkdir -p "$BUILD"
timeout 90 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTUTTI_WITH_CUDA=ON \
  -DPython3_EXECUTABLE="$(command -v python3)" > "$BUILD/gpu_check.configure.log" 2>&1
rc=$?
grep -E "tutti: NCCL transport|Python binding" "$BUILD/gpu_check.configure.log"
if [ $rc -ne 0 ] || ! grep -q "tutti: NCCL transport ON" "$BUILD/gpu_check.configure.log"; then
  tail -20 "$BUILD/gpu_check.configure.log"; echo "FAIL configure: no NCCL transport"; exit 1
fi

step "build (post_exchange_mpi_test, tutti_python, the daemons, tutti) with $JOBS jobs"
timeout 200 cmake --build "$BUILD" -j "$JOBS" --target post_exchange_mpi_test tutti_python \
  tutti-packerd tutti-stagerd tutti > "$BUILD/gpu_check.build.log" 2>&1
rc=$?
tail -3 "$BUILD/gpu_check.build.log"
result build $rc
[ $rc -eq 0 ] || exit 1

step "post-balancing exchanges over NCCL: $GPUS rank(s), one per GPU"
timeout 60 mpirun -np "$GPUS" "$BUILD/tests/post_exchange_mpi_test" --transport=nccl
result nccl_exchange $?

if [ "$GPUS" -eq 1 ]; then
  step "two ranks on one GPU: a clear NCCL error, no hang"
  log=$(timeout 60 mpirun -np 2 "$BUILD/tests/post_exchange_mpi_test" --transport=nccl 2>&1)
  rc=$?
  echo "$log" | grep -E "NCCL|CUDA|rror" | head -4
  # Expected: a non-zero exit within the timeout (124 would be a hang).
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$log" | grep -q "NCCL"; then rc=0; else rc=1; fi
  result duplicate_gpu_refused $rc
fi

step "Python: CUDA tensors through tutti.NcclTransport, ViT timing"
PYTHONPATH="$BUILD/python" timeout 100 mpirun -np 1 python3 tools/gpu_check.py
result python_nccl $?

step "the example trainer with NCCL: $GPUS rank(s), one per GPU, 10 steps"
PYTHONPATH="$BUILD/python" TUTTI_BUILD_DIR="$BUILD" timeout 120 python3 tools/gpu_check.py \
  --example --ranks "$GPUS"
result example_nccl $?

step "done in $(($(date +%s) - START)) s: $failures failure(s)"
exit $((failures > 0))
